"""The engine interface: everything servelab does differently for vLLM and SGLang.

An `EngineProfile` knows its flag table, the command line and environment that start it,
the checks and derived values for a configuration's flags, what a report says about them,
how to read its `/metrics` and where its server facts live. The registry
(`servelab.engines.get`) hands out one profile per `engine.kind`; code outside `engines/`
never branches on the kind. Not for running the process (`servelab.hosts.process`).
"""

from __future__ import annotations

import difflib
import os
import re
import shutil
import sys
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import httpx

from .flags import FlagTable, check_value, flag_args, flag_on, get_flag, load_engine_env, load_table, norm
from .prom import ServerSample, Series

if TYPE_CHECKING:  # a profile takes schema.EngineParams; schema validates flags through the profiles
    from ..schema import EngineParams


#: engine flags that set how the GPUs talk to each other (all-reduce, NCCL, all-to-all, fusions): recorded
COMM_FLAG = re.compile(r"all-?reduce|nccl|nvls|a2a|all2all|expert-parallel|dp-attention|ep-size|moe-.*backend")


@dataclass(frozen=True)
class Layout:
    """How one engine spreads over GPUs: tensor (tp), pipeline (pp) and data (dp) parallel sizes, the
    GPUs its experts are split over (ep, 1 = every GPU of a replica's TP group holds a slice of every
    expert) and whether the DP ranks only split the attention inside the TP group (SGLang's DP
    attention: no extra GPUs). `gpus` is what the engine occupies and what per-GPU figures divide by."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    ep: int = 1
    dp_attention: bool = False

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * (1 if self.dp_attention else self.dp)

    @property
    def replicas(self) -> int:
        """Independent copies of the model behind the endpoint (DP without DP attention)."""
        return 1 if self.dp_attention else self.dp

    def sizes(self) -> tuple[tuple[str, int], ...]:
        """(name, size) of each parallel dimension: TP, PP, DP, EP."""
        return ("TP", self.tp), ("PP", self.pp), ("DP", self.dp), ("EP", self.ep)

    def label(self) -> str:
        """"TP=2", "DP=2", "TP=2, EP=2", "TP=1" (one GPU): the report's and the dry run's name."""
        parts = [f"{k}={v}" for k, v in self.sizes() if v > 1]
        parts += ["DP attention"] if self.dp_attention else []
        return ", ".join(parts) or "TP=1"

    def record(self) -> dict[str, Any]:
        return {**asdict(self), "gpus": self.gpus, "label": self.label()}


def _size(args: dict[str, Any], *names: str) -> int:
    """The first of these flags that is set, as an int (1 when none is)."""
    return int(next((v for v in (get_flag(args, f) for f in names) if v is not None and v is not False), 1))


class EngineProfile:
    """Base of the engine profiles; subclasses fill the class attributes and hooks."""

    kind: str = ""
    label: str = ""  # how a report names the engine
    metrics_prefix: str = ""  # "vllm:" / "sglang:"
    env_prefix: str = ""  # prefix of the engine's own environment variables
    owned: dict[str, str] = {}  # flags servelab sets itself from EngineParams -> the key to set instead
    equivalents: dict[str, str] = {}  # a flag of another engine -> what to use on this one
    auto_flags: tuple[str, ...] = ()  # flags whose value may be `auto` (derived)
    info_paths: tuple[str, ...] = ("/version",)  # server facts endpoints, first that answers
    base_env: dict[str, str] = {"HF_HUB_OFFLINE": "1"}
    eager_flag: str = ""  # the flag that turns graphs off (decode_mode)
    #: every registered profile by kind (set by the registry, servelab.engines, through `register`)
    peers: Mapping[str, "EngineProfile"] = {}

    @classmethod
    def register(cls, profiles: Mapping[str, "EngineProfile"]) -> None:
        """Make the registry's profiles known to each other (the other engine's flags and
        environment prefix in a message) without a profile importing its package back."""
        EngineProfile.peers = profiles

    # -- flags ----------------------------------------------------------------------------
    @property
    def table(self) -> FlagTable:
        return load_table(self.kind)

    def known_flags(self) -> list[str]:
        return sorted(self.table.spell)

    def suggest(self, flag: str) -> str:
        """The message for a flag this engine does not know (spelling, or another engine's flag)."""
        hint = self.equivalents.get(flag)
        for other in self.peers.values():
            if other.kind != self.kind and flag in other.table.spell:
                art = "an" if other.label[0] in "AEIOS" else "a"
                me = "an" if self.label[0] in "AEIOS" else "a"
                msg = f"'{flag}' is {art} {other.label} flag, not {me} {self.label} one"
                return msg + (f"; use {hint}" if hint else "")
        close = difflib.get_close_matches(flag, list(self.table.spell), n=1, cutoff=0.75)
        msg = f"unknown flag '{flag}'"
        if close:
            msg += f" (did you mean '{close[0]}'?)"
        elif hint:
            msg += f"; use {hint}"
        return msg

    def validate_args(self, args: dict[str, Any], concurrency: Iterable[int] | None = None) -> list[str]:
        """Problems with the engine's CLI flags, one line each ([] = fine): unknown flags (with a
        suggestion, or the other engine's equivalent), flags servelab sets itself, a flag given
        twice, wrong value types, and the engine's own conflicts (with `concurrency`, also
        CUDA-graph sizes too small for those levels)."""
        t = self.table
        errors: list[str] = []
        seen: dict[str, str] = {}
        for key, val in args.items():
            flag = norm(key)
            if flag in self.owned:
                errors.append(f"{key}: set {self.owned[flag]} instead (servelab passes --{flag} itself)")
                continue
            canon = t.spell.get(flag)
            if canon is None:
                errors.append(self.suggest(flag))
                continue
            ident = ("no-" if flag == "no-" + canon and flag not in t.flags else "") + canon
            if ident in seen:
                errors.append(f"{key}: same flag as '{seen[ident]}'")
                continue
            seen[ident] = key
            errors += check_value(t.flags[canon], key, val, auto_ok=canon in self.auto_flags)
        return errors + self.conflicts(args, concurrency) + self.layout_problems(args)

    def conflicts(self, args: dict[str, Any], concurrency: Iterable[int] | None) -> list[str]:
        return []

    def validate_env(self, env: dict[str, str]) -> list[str]:
        """Problems with engine environment variables: another engine's prefix, bad booleans."""
        errs: list[str] = []
        others = {p.env_prefix: p.label for p in self.peers.values() if p.kind != self.kind and p.env_prefix}
        engine_env = load_engine_env()
        for k, v in env.items():
            for prefix, label in others.items():
                if k.startswith(prefix):
                    errs.append(f"env {k}: an {label} variable on a {self.kind} engine")
            spec = engine_env.get(k)
            if spec and spec["type"] == "bool" and str(v).strip().lower() not in _BOOL_STRINGS:
                errs.append(f"env {k}: expected true or false, got {v!r}")
            if not isinstance(v, str):
                errs.append(f"env {k}: values must be strings (quote them in YAML), got {type(v).__name__}")
        return errs

    def validate(self, args: dict[str, Any], env: dict[str, str] | None = None,
                 concurrency: Iterable[int] | None = None) -> list[str]:
        return self.validate_args(args, concurrency) + self.validate_env(env or {})

    # -- derived values and facts ---------------------------------------------------------
    def apply_derived(self, args: dict[str, Any], concurrency: Iterable[int]) -> dict[str, Any]:
        return dict(args)

    def spec_tokens(self, args: dict[str, Any]) -> int:
        """Draft tokens verified per decode step (k): 0 without speculative decoding."""
        return 0

    def speculative(self, args: dict[str, Any]) -> bool:
        return False

    def decode_mode(self, args: Mapping[str, Any]) -> str:
        """"eager" or "graphs": how the engine runs its decode steps with these flags (CUDA graphs on a
        GPU; on the CPU engine "graphs" is torch.compile's compiled mode)."""
        return "eager" if get_flag(args, self.eager_flag) else "graphs"

    def forced_kv_tokens(self, args: Mapping[str, Any]) -> tuple[float, str] | None:
        """KV-cache tokens an engine-only flag fixes outright, with the flag's name; None when the
        pool is sized the common way (blocks, a byte budget or a memory share)."""
        return None

    def calibration_args(self, eager: bool, gpu: bool) -> dict[str, Any]:
        """The flags of a calibration model's server (`calibrate_hw`): a small context, 4 sequences, a
        small KV pool, bf16, eager or graphs as asked."""
        raise NotImplementedError(f"{self.kind}: no calibration flags")

    def dummy_router_ties(self, config: Mapping[str, Any], version: str) -> str | None:
        """Why every token of a batch routes to the same experts on this engine version when the
        weights are dummy, or None (`analysis.perfmodel.router_ties`)."""
        return None

    def graph_prefill_tokens(self, args: Mapping[str, Any], model_type: str | None = None) -> int:
        """The most tokens one forward step runs inside a captured graph with these flags for a model of
        `model_type` (0: none); a longer prefill launches its kernels one by one (`analysis.perfmodel.prefill_step`)."""
        return 0

    def loaded_weight_bytes(self, log_text: str) -> float | None:
        """The weight bytes one GPU of the engine loaded, as its log says (None where it says nothing)."""
        return None

    def prefill_chunk_tokens(self, args: Mapping[str, Any], memory_bytes: float | None) -> int | None:
        """The most prompt tokens one step prefills (chunked prefill's budget), or None when not modelled."""
        return None

    def default_max_running(self, memory_bytes: float | None) -> int | None:
        """The most requests the engine runs at once on a GPU of `memory_bytes` when no flag sets it, or None
        when not modelled (its KV cache is then the only limit)."""
        return None

    def gpu_memory(self, args: Mapping[str, Any], total_bytes: float, weight_bytes: float | None,
                   kv_bytes_per_token: float | None) -> tuple[float | None, str]:
        """Bytes each GPU of one engine holds with these flags on a GPU of `total_bytes` (`weight_bytes`: the
        model's, `kv_bytes_per_token`: its KV cache's, None where not known), and how that was read from its
        memory flags; (None, why) when they do not say (`servelab.placement` then gives it a GPU of its own)."""
        return None, f"{self.kind} has no rule for its GPU memory"

    def compiles_at_startup(self, args: dict[str, Any]) -> bool:
        """Whether these flags make the engine compile (or capture graphs) while it starts: the long
        start-ups, which a study launching engines side by side starts first."""
        return False

    def layout(self, args: dict[str, Any]) -> Layout:
        """The parallel layout these flags start (sizes from the tensor, pipeline and data parallel flags;
        an engine's own expert-parallel rule in its profile)."""
        return Layout(tp=_size(args, "tensor-parallel-size", "tp-size", "tp"),
                      pp=_size(args, "pipeline-parallel-size", "pp-size", "pp"),
                      dp=_size(args, "data-parallel-size", "dp-size", "dp"))

    def gpu_count(self, args: dict[str, Any]) -> int:
        """GPUs one engine occupies (`layout(args).gpus`)."""
        return self.layout(args).gpus

    def layout_problems(self, args: dict[str, Any]) -> list[str]:
        """A layout the engine would refuse or that means nothing, one line each."""
        try:
            lay = self.layout(args)
        except (TypeError, ValueError):
            return []  # a size that is not an integer: the value check says so
        bad = [f"{k}={v}" for k, v in lay.sizes() if v < 1]
        return [f"parallel sizes must be at least 1, got {', '.join(bad)}"] if bad else []

    def comm_settings(self, args: dict[str, Any]) -> dict[str, Any]:
        """The flags that set how the GPUs communicate (all-reduce, NCCL, all-to-all, their fusions), as
        given; run.json records them with the NCCL_* environment."""
        return {norm(k): v for k, v in args.items() if COMM_FLAG.search(norm(k))}

    def describe(self, args: dict[str, Any], env: dict[str, str] | None = None) -> dict[str, Any]:
        """What a report says about a configuration: graph mode, speculative k, prefix cache, parsers."""
        return {"engine": self.kind, "cuda_graph": None, "capture_sizes": None, "speculative": None,
                "prefix_cache": None, "reasoning_parser": get_flag(args, "reasoning-parser"),
                "tool_call_parser": get_flag(args, "tool-call-parser"),
                "env": {k: (env or {})[k] for k in sorted(env or {})}}

    # -- launching ------------------------------------------------------------------------
    def command(self, p: EngineParams, model_dir: str, python: str | None = None) -> list[str]:
        """The exact argv that starts the engine."""
        raise NotImplementedError

    def flag_args(self, args: dict[str, Any]) -> list[str]:
        return flag_args(args)

    def environment(self, p: EngineParams) -> dict[str, str]:
        """Variables servelab adds to the engine's environment (before `engine.env`)."""
        return dict(self.base_env)

    def api_key_env(self, key: str) -> dict[str, str]:
        """How the engine receives an API key through its environment ({} = only as a flag)."""
        return {}

    def env_to_record(self, name: str) -> bool:
        """Whether an environment variable belongs in run.json's engine record."""
        return name.startswith((self.env_prefix, "CUDA_", "OMP_", "NUMBA_", "NCCL_")) or name in self.base_env

    # -- talking to it --------------------------------------------------------------------
    def server_info(self, base_url: str, headers: dict[str, str] | None = None) -> dict[str, Any]:
        """Server facts (version and what the engine reports about itself); {} when none answers."""
        for path in self.info_paths:
            try:
                r = httpx.get(base_url.rstrip("/") + path, timeout=5.0, headers=headers)
                if r.status_code == 200:
                    return {"path": path, **r.json()}
            except (httpx.HTTPError, ValueError):
                continue
        return {}

    def version(self, info: Mapping[str, Any]) -> str | None:
        v = info.get("version")
        return str(v) if v else None

    def parse_metrics(self, idx: Mapping[str, Series]) -> ServerSample:
        raise NotImplementedError


_BOOL_STRINGS = {"true", "false", "1", "0", "yes", "no", "on", "off"}


def python_executable(python: str | None) -> str:
    return python or sys.executable


#: what an engine holds beyond its weights and KV pool where its flags fix the pool (activations at the largest
#: batch, CUDA graphs, the CUDA context and allocator slack): an allowance, not a measurement
ACTIVATION_ALLOWANCE_BYTES = 3 * 2**30


def has_gpu() -> bool:
    return bool(shutil.which("nvidia-smi")) or bool(os.environ.get("CUDA_VISIBLE_DEVICES"))


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask; all of them where there is none)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


__all__ = ["ACTIVATION_ALLOWANCE_BYTES", "COMM_FLAG", "EngineProfile", "Layout", "flag_on", "get_flag", "python_executable", "has_gpu", "usable_cores"]
