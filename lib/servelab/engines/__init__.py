"""Engine registry: one `EngineProfile` per `engine.kind` (vllm, sglang).

`get(kind)` returns the profile; `parse_metrics(text)` finds the engine from the metric-name
prefixes of a `/metrics` text and lets its profile map the names. Everything engine-specific
lives in `engines/<kind>.py`; nothing outside this package branches on the kind.
"""

from __future__ import annotations

import re
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from .base import EngineProfile
from .flags import load_engine_env
from .prom import ServerSample, index_metrics
from .sglang import SglangProfile
from .vllm import VllmProfile

PROFILES: dict[str, EngineProfile] = {p.kind: p for p in (VllmProfile(), SglangProfile())}
KINDS = tuple(PROFILES)

# Documented engine environment variables (values checked where typed): data/engine-env.yaml.
ENGINE_ENV: dict[str, dict[str, Any]] = load_engine_env()
EngineProfile.register(PROFILES)  # the profiles reach each other through the registry, not by importing it


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


def detect_kind(base_url: str, headers: dict[str, str] | None = None, default: str = "vllm") -> str:
    """The engine kind of a server that already runs, from the metric names of its /metrics
    (`engine_of`); `default` where it has none or they name no known engine."""
    try:
        r = httpx.get(base_url.rstrip("/") + "/metrics", headers=headers, timeout=5.0)
    except httpx.HTTPError:
        return default
    kind = engine_of(r.text) if r.status_code == 200 else "unknown"
    return kind if kind in PROFILES else default


def parse_metrics(text: str) -> ServerSample:
    """Parse Prometheus exposition text into a `ServerSample`. Raises ValueError (from
    prometheus_client) when the text is not exposition format; an unknown engine gives
    `ServerSample(engine="unknown")`."""
    kind = engine_of(text)
    if kind == "unknown":
        list(text_string_to_metric_families(text))  # still validate the format
        return ServerSample()
    return PROFILES[kind].parse_metrics(index_metrics(text))


def build_command(p: Any, model_dir: str, python: str | None = None) -> list[str]:
    """The exact argv that starts engine `p` (schema.EngineParams) serving `model_dir`."""
    return get(p.kind).command(p, model_dir, python)


def validate_engine(kind: str, args: dict[str, Any], env: dict[str, str] | None = None,
                    concurrency: Any = None) -> list[str]:
    """Everything wrong with one engine set-up ([] = fine)."""
    return get(kind).validate(args, env, concurrency)


__all__ = ["EngineProfile", "PROFILES", "KINDS", "ENGINE_ENV", "get", "engine_of", "detect_kind", "parse_metrics",
           "validate_engine", "build_command", "ServerSample"]
