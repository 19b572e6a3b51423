"""Engine registry: one `EngineProfile` per `engine.kind` (vllm, sglang).

`get(kind)` returns the profile; `parse_metrics(text)` finds the engine from the metric-name
prefixes of a `/metrics` text and lets its profile map the names. Everything engine-specific
lives in `engines/<kind>.py`; nothing outside this package branches on the kind.
"""

from __future__ import annotations

import re
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from .base import EngineProfile
from .prom import ServerSample, _index
from .sglang import SglangProfile
from .vllm import VllmProfile

PROFILES: dict[str, EngineProfile] = {p.kind: p for p in (VllmProfile(), SglangProfile())}
KINDS = tuple(PROFILES)

# Engine environment variables the seeds set (documented; values checked where typed).
ENGINE_ENV: dict[str, dict[str, Any]] = {
    "SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE": {
        "engine": "sglang", "type": "bool",
        "doc": "keep DeepSeek V4.1's Engram tables in host (CPU) memory instead of HBM (seed 000: "
               "required on g7e.24xlarge; ~23.56 GiB less weight per GPU)"},
    "SGLANG_DSV41_ENGRAM_HOST_TABLE_LAYOUT": {
        "engine": "sglang", "type": "str",
        "doc": "host-table layout: 'private' (seed 000's dev-dsv41 image: each rank holds its share); "
               "sglang 0.5.23 names the layouts 'shared' and 'per_rank'"},
    "SGLANG_DSV41_ENGRAM_HOST_TABLE_PIN": {
        "engine": "sglang", "type": "bool",
        "doc": "allocate the host table in pinned memory for faster H2D copies (needs memlock unlimited)"},
    "SGLANG_ENABLE_DSV41_ENGRAM_DROP_PAGE_CACHE": {
        "engine": "sglang", "type": "bool",
        "doc": "drop the weight files' page cache after loading (seed 000 sets false: reload ~40 s)"},
    "SGLANG_SM120_FLASHMLA_BACKEND": {
        "engine": "sglang", "type": "str",
        "doc": "Sparse MLA implementation on SM120 (RTX PRO 6000); seed 000: triton (flashinfer stalls in prefill)"},
    "SGLANG_DEFAULT_THINKING": {
        "engine": "sglang", "type": "bool", "doc": "thinking (reasoning) on by default; seed 000: false"},
}


def get(kind: str) -> EngineProfile:
    """The profile of engine `kind`; ValueError naming the known kinds otherwise."""
    try:
        return PROFILES[kind]
    except KeyError:
        raise ValueError(f"unknown engine kind {kind!r}; expected one of {sorted(PROFILES)}") from None


def engine_of(text: str) -> str:
    """The engine kind from the metric-name prefixes of sample lines, else "unknown" (comment
    lines are ignored; if several prefixes occur, the one with most sample lines wins)."""
    counts = {k: len(re.findall(rf"^{re.escape(p.metrics_prefix)}", text, re.MULTILINE)) for k, p in PROFILES.items()}
    best = max(counts, key=lambda k: counts[k])
    return best if counts[best] else "unknown"


def parse_metrics(text: str) -> ServerSample:
    """Parse Prometheus exposition text into a `ServerSample`. Raises ValueError (from
    prometheus_client) when the text is not exposition format; an unknown engine gives
    `ServerSample(engine="unknown")`."""
    kind = engine_of(text)
    if kind == "unknown":
        list(text_string_to_metric_families(text))  # still validate the format
        return ServerSample()
    return PROFILES[kind].parse_metrics(_index(text))


def build_command(p: Any, model_dir: str, python: str | None = None) -> list[str]:
    """The exact argv that starts engine `p` (schema.EngineParams) serving `model_dir`."""
    return get(p.kind).command(p, model_dir, python)


def validate_engine(kind: str, args: dict[str, Any], env: dict[str, str] | None = None,
                    concurrency: Any = None) -> list[str]:
    """Everything wrong with one engine set-up ([] = fine)."""
    return get(kind).validate(args, env, concurrency)


__all__ = ["EngineProfile", "PROFILES", "KINDS", "ENGINE_ENV", "get", "engine_of", "parse_metrics",
           "validate_engine", "build_command", "ServerSample"]
