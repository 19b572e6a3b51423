"""Where a study's engines run (`placement:`), decided before anything starts: on the machine's GPUs,
which NVML lists (`measure.inventory`), or on its CPU.

On GPUs (`plan_gpus`):
- **Servers.** Configurations whose resolved engine is identical (its port aside) share one server and are
  measured one after another on it, in the study's order.
- **GPUs per server.** Its layout's (TP x PP x DP; `engines.Layout`). A one-GPU server goes into a lane (one
  GPU; lanes run side by side on different GPUs: `placement.lanes`, else the free GPUs share the servers
  round robin); a wider one, or one in `placement.all_gpus`, runs after the lanes on the GPUs it takes.
- **Servers sharing a GPU.** Consecutive servers of a lane whose memory settings fit the GPU's free memory
  together (the engines' own flags: `EngineProfile.gpu_memory`) form a group: started together (`stagger_s`
  apart), measured one at a time, each stopped after its last configuration. `placement.groups` names them
  instead; `share_gpu: false` keeps one server on a GPU at a time. Two engines at vLLM's default
  gpu-memory-utilization (0.9) never share a GPU.
- **Refusals** (`PlacementError`, one line each, exit 2): a layout wider than the machine (or than
  `placement.gpus`), a server whose memory settings need more than any GPU has free.
Each server gets its own port (the engine's port + its place in the study) and `CUDA_VISIBLE_DEVICES` (NVML
indices, `CUDA_DEVICE_ORDER=PCI_BUS_ID`).

On the CPU (no GPU, or `placement.gpus: 0`) the engines run side by side and are measured interleaved
(`sidebyside`), or one at a time where they cannot be (`sidebyside.interleave_blocked`): the same runner with
the CPU's placement. Not for starting anything (`lanes`, `sidebyside`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from .engines import get as engine_profile
from .errors import UserError
from .measure.inventory import Gpu, source_line
from .schema import EngineParams, Study, layout_of, resolve_profile

GIB = 2.0**30
HEADROOM_BYTES = 1 * 2**30  # left free on a GPU whose servers share it (the CUDA context of a late start)


class PlacementError(UserError, ValueError):
    """The study cannot be placed on this machine; one line per problem (exit 2, before anything starts)."""


@dataclass(eq=False)  # one server is one object: hashed by identity
class Server:
    """One engine process: the configurations measured on it, the GPUs it takes and the memory it holds on each."""

    id: str  # its first configuration's id
    configs: list[str]
    engine: EngineParams  # resolved (derived values), with its port and CUDA_VISIBLE_DEVICES once placed
    width: int  # GPUs it takes (its layout's)
    memory_bytes: float | None  # on each of its GPUs; None: its flags do not say (a GPU of its own)
    memory_how: str
    gpus: tuple[int, ...] = ()

    def line(self) -> str:
        mem = f"{self.memory_bytes / GIB:.1f} GiB per GPU ({self.memory_how})" if self.memory_bytes is not None \
            else f"memory not known ({self.memory_how}): a GPU of its own"
        return (f"server {self.id} on GPU {','.join(map(str, self.gpus))}, port {self.engine.port}: "
                f"{', '.join(self.configs)}; {mem}")


@dataclass
class Group:
    """Servers started together on the same GPUs and measured one at a time."""

    servers: list[Server]


@dataclass
class Lane:
    """GPUs that run groups one after another; the lanes of a phase run side by side."""

    gpus: tuple[int, ...]
    groups: list[Group] = field(default_factory=list)


@dataclass
class Placement:
    """Where every server of a study runs: `phases` one after another, the lanes of a phase side by side.
    `machine` empty: on the CPU (`cpu` True), placed by `sidebyside`."""

    machine: list[Gpu]
    phases: list[list[Lane]] = field(default_factory=list)
    stagger_s: float = 0.0

    @property
    def cpu(self) -> bool:
        return not self.machine

    def servers(self) -> list[Server]:
        return [s for phase in self.phases for lane in phase for g in lane.groups for s in g.servers]

    def server_of(self, config_id: str) -> Server:
        return next(s for s in self.servers() if config_id in s.configs)

    def lines(self) -> list[str]:
        """What the dry run and the log say: the machine, each phase's lanes, their groups and servers."""
        if self.cpu:
            return ["placement: on this machine's CPU (engines side by side where they fit, measured interleaved)"]
        out = [f"placement: {source_line(self.machine)}"]
        for i, phase in enumerate(self.phases):
            lanes = len(phase)
            side = f"{lanes} lanes side by side" if lanes > 1 else "one lane"
            out.append(f"placement: phase {i + 1}: {side}" if len(self.phases) > 1 else f"placement: {side}")
            for lane in phase:
                for g in lane.groups:
                    together = " (started together, measured one at a time)" if len(g.servers) > 1 else ""
                    for s in g.servers:
                        out.append(f"placement:   {s.line()}{together}")
        return out

    def record(self) -> dict[str, Any]:
        """design.json's `placement`: the machine, and per server its GPUs, port, configurations and memory."""
        return {"machine": [{"index": g.index, "name": g.name, "total_bytes": g.total_bytes, "free_bytes": g.free_bytes,
                             "source": g.source} for g in self.machine],
                "phases": [[{"gpus": list(lane.gpus), "groups": [[s.id for s in g.servers] for g in lane.groups]}
                            for lane in phase] for phase in self.phases],
                "servers": {s.id: {"configs": s.configs, "gpus": list(s.gpus), "port": s.engine.port,
                                   "memory_bytes": s.memory_bytes, "memory": s.memory_how} for s in self.servers()}}


def engine_key(eng: EngineParams) -> str:
    """What makes two configurations' engines one server: every setting but the port."""
    return json.dumps(eng.model_dump(exclude={"port"}), sort_keys=True, default=str)


def model_sizes(eng: EngineParams, model_dir: str | None = None) -> tuple[float | None, float | None]:
    """(weight bytes, KV bytes per token) of the engine's model from its facts (`models.facts`): a preset's
    config, or a model directory's; (None, None) where neither is at hand (a preset not built yet)."""
    from .models.facts import facts_from_config, model_facts  # transformers: only where a study is placed
    from .models.presets import PRESETS

    try:
        if model_dir:
            f = model_facts(model_dir)  # type: ignore[arg-type]
        elif eng.model is not None and eng.model.preset in PRESETS:
            f = facts_from_config(dict(PRESETS[eng.model.preset]))
        else:
            return None, None
    except Exception:  # noqa: BLE001 - an architecture the library cannot build: its memory is not known
        return None, None
    return float(f["weight_bytes"]), float(f.get("kv_cache_bytes_per_token") or 0) or None


def build_servers(study: Study, ids: list[str], model_dirs: dict[str, str] | None = None,
                  total_bytes: float | None = None) -> list[Server]:
    """The servers of configurations `ids` in the study's order, each with its width and its memory on a GPU of
    `total_bytes` (None: not known yet)."""
    servers: dict[str, Server] = {}
    for cid in ids:
        eng = resolve_profile(study, cid)
        key = engine_key(eng)
        if key in servers:
            servers[key].configs.append(cid)
            continue
        width = layout_of(study, cid).gpus
        mem, how = None, "the machine's GPU memory is not known"
        if total_bytes:
            weights, kv = model_sizes(eng, (model_dirs or {}).get(cid))
            mem, how = engine_profile(eng.kind).gpu_memory(eng.args, total_bytes, weights, kv)
        servers[key] = Server(cid, [cid], eng, width, mem, how)
    return list(servers.values())


def uses_gpus(study: Study, machine: list[Gpu]) -> bool:
    """Whether the study runs on GPUs here: `placement.gpus` says so, else the machine has some."""
    n = study.placement.gpus
    return bool(machine) if n is None else n > 0


def plan(study: Study, ids: list[str], machine: list[Gpu], *, model_dirs: dict[str, str] | None = None,
         source: str = "params") -> Placement:
    """The placement of configurations `ids` on `machine` (its GPUs now; [] for a CPU). PlacementError, naming
    every problem, when they cannot all be placed (`source`: the params file, for the message)."""
    if not machine and study.placement.on_gpus:
        need = max([study.placement.gpus or 1, *(layout_of(study, c).gpus for c in ids)])
        raise PlacementError(f"{source}: the study places its engines on {_gpus(need)} (placement), and this machine "
                             f"has {source_line(machine)}: run it on a GPU machine (docs/gpu.md), or see its placement "
                             "with --dry-run --gpus 1xH100")
    if not uses_gpus(study, machine):
        return Placement([])
    return plan_gpus(study, ids, machine, model_dirs=model_dirs, source=source)


def plan_gpus(study: Study, ids: list[str], machine: list[Gpu], *, model_dirs: dict[str, str] | None = None,
              source: str = "params") -> Placement:
    """See the module docstring."""
    pl = study.placement
    usable = machine[: pl.gpus] if pl.gpus else list(machine)
    total = min((g.total_bytes for g in usable if g.total_bytes), default=None)
    servers = build_servers(study, ids, model_dirs, total)
    every = len(usable)
    problems = []
    for s in servers:
        if any(c in pl.all_gpus for c in s.configs):
            s.width = max(s.width, pl.gpus or every)
        pinned = s.engine.env.get("CUDA_VISIBLE_DEVICES")
        if pinned is not None:
            s.gpus = tuple(int(x) for x in pinned.split(",") if x.strip())
        if s.width > every:
            problems.append(f"{source}: {', '.join(s.configs)}: layout {layout_of(study, s.id).label()} takes "
                            f"{_gpus(s.width)}; this machine has {source_line(usable)}: run it on a machine with {s.width}, or "
                            "leave it out (--config)")
        elif s.memory_bytes is not None:
            free = max((g.free_bytes for g in usable if g.free_bytes is not None), default=None)
            if free is not None and s.memory_bytes > free:
                problems.append(f"{source}: {', '.join(s.configs)}: its memory settings need "
                                f"{s.memory_bytes / GIB:.1f} GiB per GPU ({s.memory_how}); the most any GPU has free "
                                f"is {free / GIB:.1f} GiB")
    if problems:
        raise PlacementError("\n".join(problems))
    narrow = [s for s in servers if s.width == 1 and not s.gpus]
    pinned = [s for s in servers if s.gpus]
    wide = [s for s in servers if s.width > 1 and not s.gpus]
    phases = [p for p in (_lanes(study, narrow, usable), _wide(wide, usable), _pinned(pinned)) if p]
    _ports(study, servers)
    return Placement(list(machine), phases, pl.stagger_s)


def _gpus(n: int) -> str:
    return f"{n} GPU{'s' if n != 1 else ''}"


def _fits(servers: list[Server], gpu: Gpu) -> bool:
    """Whether these servers' memory settings fit one GPU's free memory together (unknown memory never shares)."""
    if len(servers) == 1:
        return True
    if any(s.memory_bytes is None for s in servers) or gpu.free_bytes is None:
        return False
    return sum(s.memory_bytes for s in servers) + HEADROOM_BYTES <= gpu.free_bytes  # type: ignore[misc]


def _lanes(study: Study, narrow: list[Server], usable: list[Gpu]) -> list[Lane]:
    """The one-GPU servers in lanes, one GPU each (lanes beyond the GPUs fold onto them), grouped where they share."""
    if not narrow:
        return []
    pl = study.placement
    by_config = {c: s for s in narrow for c in s.configs}
    if pl.groups:
        named = [[by_config[c] for c in g if c in by_config] for g in pl.groups]
        groups = [list(dict.fromkeys(g)) for g in named if g]
        seen = {s.id for g in groups for s in g}
        groups += [[s] for s in narrow if s.id not in seen]
        lanes = [Lane((usable[i % len(usable)].index,)) for i in range(min(len(groups), len(usable)))]
        for i, g in enumerate(groups):
            lanes[i % len(lanes)].groups.append(Group(g))
        return _assign(lanes)
    if pl.lanes:
        order = [[by_config[c] for c in lane if c in by_config] for lane in pl.lanes]
        placed: set[str] = set()
        lists = []
        for lane in order:
            lists.append([s for s in dict.fromkeys(lane) if s.id not in placed])
            placed |= {s.id for s in lists[-1]}
        rest = [s for s in narrow if s.id not in placed]
        lists = [x for x in lists if x] or [[]]
        for s in rest:
            min(lists, key=len).append(s)
    else:
        n = min(len(usable), len(narrow))
        lists = [narrow[i::n] for i in range(n)]
    lanes = [Lane((usable[i % len(usable)].index,)) for i in range(min(len(lists), len(usable)))]
    for i, servers in enumerate(lists):  # a lane beyond the GPUs runs after the one on its GPU
        lane = lanes[i % len(lanes)]
        gpu = next(g for g in usable if g.index == lane.gpus[0])
        for s in servers:
            last = lane.groups[-1].servers if lane.groups else None
            if pl.share_gpu and last is not None and _fits([*last, s], gpu):
                last.append(s)
            else:
                lane.groups.append(Group([s]))
    return _assign(lanes)


def _wide(wide: list[Server], usable: list[Gpu]) -> list[Lane]:
    """Servers of several GPUs after the lanes: as many side by side as disjoint GPU sets of their width allow."""
    if not wide:
        return []
    width = max(s.width for s in wide)
    slots = [tuple(g.index for g in usable[i * width:(i + 1) * width]) for i in range(len(usable) // width)]
    lanes = [Lane(slot) for slot in slots[: len(wide)]]
    for i, s in enumerate(wide):
        lane = lanes[i % len(lanes)]
        lane.groups.append(Group([s]))
    for lane in lanes:
        for g in lane.groups:
            for s in g.servers:
                s.gpus = lane.gpus[: s.width]
    return lanes


def _pinned(pinned: list[Server]) -> list[Lane]:
    """Servers whose own engine.env names their GPUs: one after another, on those GPUs."""
    if not pinned:
        return []
    return [Lane(tuple(sorted({g for s in pinned for g in s.gpus})), [Group([s]) for s in pinned])]


def _assign(lanes: list[Lane]) -> list[Lane]:
    for lane in lanes:
        for g in lane.groups:
            for s in g.servers:
                s.gpus = lane.gpus
    return [lane for lane in lanes if lane.groups]


def _ports(study: Study, servers: list[Server]) -> None:
    """Each server its own port (its engine's port + its place among the study's servers) and its GPUs in its
    environment."""
    for i, s in enumerate(servers):
        env = {**s.engine.env, "CUDA_VISIBLE_DEVICES": ",".join(map(str, s.gpus)), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
        s.engine = s.engine.model_copy(update={"port": s.engine.port + i, "env": env})


__all__ = ["Group", "Lane", "Placement", "PlacementError", "Server", "build_servers", "engine_key", "model_sizes",
           "plan", "plan_gpus", "uses_gpus"]
