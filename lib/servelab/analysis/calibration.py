"""Calibration entries of the performance model (`analysis.perfmodel`): the dated measurements of a
machine in `data/calibrations/` (written by `servelab calibrate-hw`), the fits that turn calibration
runs into an engine's costs, and `Machine`, what the model reads of an entry (bandwidth by batch, GEMM
throughput by rows, the engine's CPU-side and GPU fixed costs per step). The entries are read by
`tables`; not for the model's arithmetic (`perfmodel`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..tables import calibration_entries
import numpy as np

from .hosts import host_factor


def calibrations(folder: Path | str | None = None) -> list[dict[str, Any]]:
    """Every calibration entry (`data/calibrations/*.yaml`), oldest first by measurement date."""
    return sorted(calibration_entries(folder), key=lambda d: str(d.get("measured_at", "")))


def _norm(s: str) -> str:
    return " ".join(str(s).lower().replace("nvidia", "").replace("-", " ").replace("_", " ").split())


def calibration_for(machine_kind: str, name: str | None, folder: Path | str | None = None) -> tuple[dict[str, Any] | None, bool]:
    """The newest entry for this machine (`machine_kind` gpu/cpu, its name as nvidia-smi or the CPU
    model gives it), and whether it is this machine's own kind; else the newest of the same kind
    (False), else None."""
    same = [c for c in calibrations(folder) if c["machine"]["kind"] == machine_kind]
    exact = [c for c in same if name and (_norm(c["machine"]["name"]) == _norm(name)
                                          or _norm(name) in _norm(c["machine"]["name"]))]
    if exact:
        return exact[-1], True
    return (same[-1], False) if same else (None, False)


# -- fitting the engine's fixed costs from calibration runs --------------------------------------

def fit_fixed_costs(points: Sequence[Mapping[str, float]], bandwidth_Bps: float) -> dict[str, Any]:
    """Per-layer and per-step cost of one kind and mode from calibration runs: `points` of
    layers, tpot_s (median c=1) and weight_bytes (read per step); the weight time (bytes over
    `bandwidth_Bps`) is taken off, the rest fitted as step + layers x layer by least squares."""
    xs = np.array([float(p["layers"]) for p in points])
    ys = np.array([float(p["tpot_s"]) - float(p["weight_bytes"]) / bandwidth_Bps for p in points])
    if len(set(xs)) < 2:
        raise ValueError("fixed costs need calibration models of at least two depths")
    b, a = np.polyfit(xs, ys, 1)
    pred = a + b * xs
    ss = float(((ys - ys.mean()) ** 2).sum())
    r2 = 1.0 - float(((ys - pred) ** 2).sum()) / ss if ss > 0 else 1.0
    return {"layer_s": float(max(b, 0.0)), "step_s": float(max(a, 0.0)), "r2": r2, "n": int(len(xs)),
            "points": [dict(p) for p in points]}


def fit_graph_costs(points: Sequence[Mapping[str, float]], bandwidth_Bps: float, shallow_max: int = 8) -> dict[str, Any]:
    """CUDA-graph costs of one kind from calibration models of several depths. The engine's CPU side
    (scheduling, sampling, streaming) puts a floor under every step: the models shallow enough to
    sit on it (<= `shallow_max` layers) give it (their median TPOT). The deepest model gives the GPU's
    cost per layer: its TPOT less its weights' time over its layers when it rose above the floor (by
    more than 10 %), else its TPOT over its layers, an upper bound (its GPU time stayed under the
    floor). The floor moves with the host's load (1.9-2.5 ms in one hold), so a middle depth is not
    trusted to have risen above it."""
    shallow = [p for p in points if p["layers"] <= shallow_max]
    floor = statistics.median(float(p["tpot_s"]) for p in shallow) if shallow else 0.0
    out: dict[str, Any] = {"floor_s": floor}
    deep = [p for p in points if p["layers"] > shallow_max]
    if deep:
        q = max(deep, key=lambda p: p["layers"])
        above = float(q["tpot_s"]) > 1.1 * floor
        t = float(q["tpot_s"]) - (float(q["weight_bytes"]) / bandwidth_Bps if above else 0.0)
        out.update(gpu_layer_s=t / float(q["layers"]), gpu_step_s=0.0,
                   gpu_layer_rule=(f"the deepest model ({q['layers']} layers) above the floor" if above else
                                   f"an upper bound: the deepest model ({q['layers']} layers) stayed on the floor"))
    return out


def fit_collective(points: Sequence[Mapping[str, float]]) -> dict[str, Any]:
    """A collective's cost as alpha + bytes / beta from timed sizes (`points` of bytes and seconds), fitted by
    least squares on the relative error (1/seconds weights: the small sizes, a decode step's, count as much
    as the large); alpha and 1/beta kept non-negative."""
    x = np.array([float(p["bytes"]) for p in points])
    y = np.array([float(p["seconds"]) for p in points])
    if len(set(x.tolist())) < 2:
        raise ValueError("a collective's fit needs at least two sizes")
    slope, alpha = np.polyfit(x, y, 1, w=1.0 / y)
    slope, alpha = max(float(slope), 1e-18), max(float(alpha), 0.0)
    rel = float(np.max(np.abs(alpha + x * slope - y) / y))
    return {"alpha_s": alpha, "beta_Bps": 1.0 / slope, "max_rel_err": rel, "n": int(len(x)),
            "points": [dict(p) for p in points]}


def fit_engine_bandwidth(narrow: Mapping[str, Any], wide: Mapping[str, Any], narrow_bytes_per_layer: float,
                         wide_bytes_per_layer: float) -> float:
    """The engine's own decode bandwidth from two calibration widths of one kind: the slopes of
    time per step against layers differ by the wider layers' extra bytes over that bandwidth."""
    extra = wide["layer_slope_s"] - narrow["layer_slope_s"]
    if extra <= 0:
        raise ValueError("the wider calibration models were not slower per layer: no bandwidth to fit")
    return (wide_bytes_per_layer - narrow_bytes_per_layer) / extra


def _interp_log(table: Mapping[str, float], x: float) -> float:
    """A measured table (string keys of positive numbers) read at x, linear in log x, clamped."""
    pts = sorted((float(k), float(v)) for k, v in table.items())
    if not pts:
        return math.nan
    lx = math.log(max(x, 1e-9))
    if lx <= math.log(pts[0][0]):
        return pts[0][1]
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if lx <= math.log(x1):
            f = (lx - math.log(x0)) / (math.log(x1) - math.log(x0))
            return y0 + f * (y1 - y0)
    return pts[-1][1]


def _layer_cost(costs: Mapping[str, Any], kind: str, key: str = "layer_s") -> float | None:
    if kind == "mla_dense":
        parts = [_layer_cost(costs, k, key) for k in ("mla", "dense", "moe")]
        return None if None in parts else max(0.0, parts[0] + parts[1] - parts[2])
    c = costs.get(kind)
    if c is None and kind == "moe_shared":  # an entry without the kind: its routed experts' costs
        c = costs.get("moe")
    return float(c[key]) if c and key in c else None


class Machine:
    """The measured parameters the model uses, from one calibration entry (and, for another CPU
    of the same kind, scaled by the probes of both machines)."""

    def __init__(self, entry: Mapping[str, Any], *, own: bool = True, probe: Mapping[str, Any] | None = None,
                 memory_bytes: float | None = None, host_probe: Mapping[str, Any] | None = None,
                 scale_host: float | None = None) -> None:
        self.entry, self.own = dict(entry), own
        #: the terms carried from another GPU's calibration (`analysis.transfer`), each with its rule and source
        self.transfer: list[dict[str, Any]] = list(entry.get("transfer") or [])
        self.transferred_from: str | None = entry.get("transferred_from")
        self.kind = entry["machine"]["kind"]
        micro = entry.get("micro") or {}
        self.gemm = (micro.get("gemm_flops") or {})
        self.decode_bw = dict(micro.get("decode_bandwidth_Bps") or {})
        self.memory_bytes = memory_bytes or entry["machine"].get("memory_bytes")
        self.scale_bw = self.scale_fixed = 1.0
        cal_probe = entry.get("probe") or {}
        if not own and probe and cal_probe:  # another CPU: its own copy bandwidth (the probe's matmul rate
            # varies three-fold with a neighbour's load, so the fixed costs stay the calibration's)
            self.scale_bw = float(probe["copy_bandwidth_Bps"]) / float(cal_probe["copy_bandwidth_Bps"])
        #: a GPU's host: its CPU-side terms (floor, eager launches, request cost) over the calibration host's
        #: (`analysis.hosts`: measured on this host, else the typical host seen); `scale_host` sets it (the band)
        self.host = host_factor(self.entry, host_probe)
        self.scale_host = float(self.host["factor"] if scale_host is None else scale_host)

    @property
    def label(self) -> str:
        m = self.entry["machine"]
        own = "" if self.own else " (another machine of its kind: its bandwidth scaled by this machine's copy probe)"
        if self.transferred_from:
            return (f"{m['name']}: terms carried from {self.transferred_from} (measured "
                    f"{str(self.entry.get('measured_at', ''))[:10]}) by the datasheets")
        return f"{self.entry.get('id')}: {m['name']}, measured {str(self.entry.get('measured_at', ''))[:10]}{own}"

    def request(self, engine: str) -> tuple[float | None, str]:
        """The engine's fixed cost of one request (HTTP, chat template, tokenization, scheduling, the first
        token's way back: a TTFT less the model's prefill step, `calibrate-hw --ttft-from`), and where from."""
        r = ((self.entry.get("engines") or {}).get(engine) or {}).get("request") or {}
        if "request_s" not in r:
            return None, f"{engine}: no request cost calibrated (calibrate-hw --ttft-from)"
        host = f", the host of {self.transferred_from}" if self.transferred_from else ""
        return float(r["request_s"]) * self.scale_host, f"{engine} request cost: {r.get('source', '')}{host}"

    def launch_wait(self, engine: str) -> float:
        """The share of the GPU's work that a step launched without captured graphs waits on beyond the longer
        of its launches and the GPU's work (0: the launches run ahead of the GPU; 1: they wait on it all),
        fitted with the request cost (`perfmodel_terms.fit_request_cost`); 0 where not fitted."""
        r = ((self.entry.get("engines") or {}).get(engine) or {}).get("request") or {}
        return float(r.get("launch_wait") or 0.0)

    def graph_prefill_cpu(self, engine: str, counts: Mapping[str, int]) -> float:
        """The host's launches of a prefill step inside captured graphs beyond the graph's floor: each latent-attention
        layer's attention, run between the graph's pieces (`calibrate-hw --mla-prefill-from`); 0 where not fitted."""
        per = float((((self.entry.get("engines") or {}).get(engine) or {}).get("mla_graph_prefill") or {}).get("layer_s")
                    or 0.0)
        return per * (counts.get("mla", 0) + counts.get("mla_dense", 0)) * self.scale_host

    def bandwidth(self, engine: str, batch: float) -> tuple[float, str]:
        eng = (self.entry.get("engines") or {}).get(engine) or {}
        if eng.get("bandwidth_Bps"):
            return float(eng["bandwidth_Bps"]) * self.scale_bw, f"{engine}'s own decode bandwidth (calibration widths)"
        if self.decode_bw:
            return _interp_log(self.decode_bw, batch) * self.scale_bw, f"bf16 GEMV bandwidth at batch {batch:g} (micro)"
        raise KeyError("the calibration entry has no bandwidth")

    def flops(self, precision: str, rows: float) -> tuple[float, str]:
        table = self.gemm.get(precision) or self.gemm.get("bf16") or {}
        if not table:
            return math.nan, "no GEMM throughput measured"
        used = precision if self.gemm.get(precision) else "bf16"
        return _interp_log(table, rows) / self.scale_fixed, f"{used} GEMM at {rows:g} rows (micro)"

    def collective(self, op: str, n: int) -> tuple[float, float] | None:
        """(alpha_s, beta_Bps) of collective `op` (all_reduce, all_to_all) across n GPUs of this machine, from
        the entry's `micro.collectives` (`servelab calibrate-hw --collectives`), or None when not measured."""
        c = (((self.entry.get("micro") or {}).get("collectives") or {}).get(str(n)) or {}).get(op)
        return (float(c["alpha_s"]), float(c["beta_Bps"])) if c else None

    def fixed(self, engine: str, mode: str, counts: Mapping[str, int]) -> tuple[float | None, float, str, bool]:
        """(the engine's CPU-side time per step, its GPU fixed time per step, where from, whether it is
        the engine's own calibration in this mode). On the CPU engine everything is the first, added
        to the bytes; on a GPU a step takes the longer of the CPU side and the GPU's bytes + fixed time.
        None when no calibration has these layer kinds."""
        engines = self.entry.get("engines") or {}
        gpu_costs = (engines.get(engine) or {}).get("graphs") or (engines.get("vllm") or {}).get("graphs") or {}
        gpu = 0.0
        if self.kind == "gpu":
            per = [_layer_cost(gpu_costs, k, "gpu_layer_s") for k in counts]
            if None not in per and gpu_costs:
                gpu = max(float(c.get("gpu_step_s", 0.0)) for c in gpu_costs.values() if isinstance(c, Mapping)) \
                    + sum(n * c for n, c in zip(counts.values(), per))
        for eng, md, own in ((engine, mode, True), ("vllm", mode, False), (engine, "eager", False),
                             ("vllm", "eager", False)):
            costs = (engines.get(eng) or {}).get(md)
            if not costs:
                continue
            if md == "graphs" and self.kind == "gpu":  # the CPU side's floor
                floors = [float(c["floor_s"]) for c in costs.values() if isinstance(c, Mapping) and "floor_s" in c]
                if floors:
                    return max(floors) * self.scale_host, gpu, f"{eng} CUDA-graph floor and GPU costs ({', '.join(counts)} layers)", own
            layers = [_layer_cost(costs, k) for k in counts]
            if None in layers:
                continue
            step = max(float(c.get("step_s", 0.0)) for c in costs.values() if isinstance(c, Mapping) and "step_s" in c)
            total = (step + sum(n * c for n, c in zip(counts.values(), layers))) * self.scale_fixed * self.scale_host
            return total, gpu, f"{eng} {md} fixed costs ({', '.join(counts)} layers)", own
        return None, gpu, "no fixed costs calibrated for these layer kinds", False

    def eager_cpu(self, engine: str, counts: Mapping[str, int]) -> tuple[float | None, str, bool]:
        """The engine's CPU side of a step that runs without captured graphs (its eager calibration: the
        step's cost and each layer kind's kernel launches, on this host), where from, and whether the engine's
        own. The launches run ahead of the GPU's work: such a step takes the longer of the two, plus the share
        of the shorter one the host's launches wait on (`launch_wait`). None when no eager costs cover these
        layer kinds."""
        engines = self.entry.get("engines") or {}
        for eng, own in ((engine, True), ("vllm", False)):
            costs = (engines.get(eng) or {}).get("eager")
            if not costs:
                continue
            layers = {k: _layer_cost(costs, k) for k in counts}
            if None in layers.values():
                continue
            step = max(float(c.get("step_s", 0.0)) for c in costs.values() if isinstance(c, Mapping) and "step_s" in c)
            cpu = (step + sum(n * layers[k] for k, n in counts.items())) * self.scale_fixed * self.scale_host
            return cpu, f"{eng} eager launch costs ({', '.join(counts)} layers)", own
        return None, "no eager costs calibrated for these layer kinds", False


def gpu_machine(name: str | None, folder: Path | str | None = None,
                memory_bytes: float | None = None, host_probe: Mapping[str, Any] | None = None) -> tuple[Machine | None, str]:
    """The machine of a GPU by name: its own calibration entry; else (no entry, or one of micro-benchmarks
    only) the nearest calibrated GPU's terms carried to it by the datasheets (`analysis.transfer`), each
    labelled; else None and why (no datasheet row, or no calibrated GPU to carry from)."""
    from . import transfer

    entry, own = calibration_for("gpu", name, folder)
    target = transfer.hardware_row(str(name or ""))
    if not own and target is not None:  # another name of the same GPU ("H200 SXM" for "NVIDIA H200")
        same = [c for c in calibrations(folder) if c["machine"]["kind"] == "gpu"
                and (transfer.hardware_row(str(c["machine"]["name"])) or {}).get("name") == target["name"]]
        entry, own = (same[-1], True) if same else (entry, False)
    if entry is not None and own and transfer.has_engine_costs(entry):
        return Machine(completed(entry, folder), own=True, memory_bytes=memory_bytes, host_probe=host_probe), ""
    if target is None:
        have = f" (have {entry['machine']['name']})" if entry is not None else ""
        return None, (f"no calibration entry for {name}{have} and no datasheet row to carry one to: run servelab "
                      "calibrate-hw there")
    near = transfer.nearest_calibrated(target, calibrations(folder))
    if near is None:
        return None, f"no calibration entry for a GPU to carry to {name}: run servelab calibrate-hw on one"
    micro = entry.get("micro") if entry is not None and own else None
    source = completed(near[0], folder)  # the nearest entry's host terms, completed where it lacks some
    carried = transfer.transferred_entry(target, source, near[1], own_micro=micro,
                                         own_id=entry.get("id") if micro else None)
    return Machine(carried, own=True, memory_bytes=memory_bytes or target.get("memory_bytes"), host_probe=host_probe), ""


def completed(entry: Mapping[str, Any], folder: Path | str | None = None) -> dict[str, Any]:
    """A GPU's own entry with the terms it lacks (a request cost, eager costs of a layer kind, the GPU's per-layer kernel
    time) carried from the nearest other calibrated GPU entry that has them, scaled by what both machines measured or
    by the clocks (`analysis.transfer.complete_entry`)."""
    from . import transfer

    row = transfer.hardware_row(str(entry["machine"]["name"]))
    others = [e for e in calibrations(folder) if e.get("id") != entry.get("id") and e["machine"]["kind"] == "gpu"
              and any(isinstance(v, Mapping) and v.get("request") for v in (e.get("engines") or {}).values())]
    if row is None or not others:
        return dict(entry)
    near = transfer.nearest_calibrated(row, others)
    return transfer.complete_entry(entry, near[0]) if near else dict(entry)


def machine_for(run: Mapping[str, Any], folder: Path | str | None = None) -> tuple[Machine | None, str]:
    """The calibrated machine of a run record (its GPUs, else the CPU it measured), or None and why."""
    gpus = run.get("gpus_used") or (run.get("client_host") or {}).get("gpus") or []
    if gpus:
        mib = str(gpus[0].get("memory") or "").split()
        mem = float(mib[0]) * 2**20 if mib and mib[0].replace(".", "").isdigit() else None  # nvidia-smi "143771 MiB"
        return gpu_machine(gpus[0].get("name"), folder, mem, run.get("host_probe"))
    probe = run.get("hardware_measured")
    if probe:
        entry, own = calibration_for("cpu", probe.get("cpu_model"), folder)
        if entry is None:
            return None, "no calibration entry for a CPU: run servelab calibrate-hw"
        return Machine(entry, own=own and _same_cpu(entry, probe), probe=probe), ""
    return None, "the hardware is unknown (no GPU reported, no CPU probe)"


def _same_cpu(entry: Mapping[str, Any], probe: Mapping[str, Any]) -> bool:
    """The calibration's CPU is this one: the same cores and the same signature (family, model and
    bf16 instruction sets: two machine types here share the name 'AMD EPYC' and differ two-fold), or,
    for a probe without a signature, a copy bandwidth within 25 %."""
    cal = entry.get("probe") or {}
    if not cal:
        return True
    if cal.get("cpu_count") != probe.get("cpu_count"):
        return False
    if cal.get("cpu_signature") and probe.get("cpu_signature"):
        return cal["cpu_signature"] == probe["cpu_signature"]
    ratio = float(probe["copy_bandwidth_Bps"]) / float(cal["copy_bandwidth_Bps"])
    return bool(0.8 <= ratio <= 1.25)


__all__ = ["Machine", "calibration_for", "gpu_machine", "calibrations", "fit_collective", "fit_engine_bandwidth",
           "fit_fixed_costs",
           "fit_graph_costs", "machine_for"]
