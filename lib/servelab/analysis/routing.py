"""The experts a MoE engine's decode steps touched, from its own routing report (vLLM and SGLang
`--enable-return-routed-experts`: each response carries the experts every MoE layer's router chose for
every token, vLLM's as base64 `.npy` of shape (tokens - 1, layers, k)). For n requests decoded together,
the t-th generated token of each rides in the same decode step; the distinct experts of those n tokens per
layer is what the step read, held against spread routing's E (1 - (1 - k/E)^n) (`analysis.physics`).
No I/O: the probe that asks the server is `measure.routing`."""

from __future__ import annotations

import base64
import io
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .perfmodel_parallel import distinct_experts


def decode_routed(b64: str) -> np.ndarray:
    """vLLM's `routed_experts` field: base64 of a `.npy` array (tokens - 1, layers, k)."""
    return np.load(io.BytesIO(base64.b64decode(b64)), allow_pickle=False)


def distinct_per_step(arrays: Sequence[np.ndarray], prompt_tokens: Sequence[int]) -> dict[str, Any]:
    """Distinct experts per layer per decode step over requests decoded together: request i's routing rows
    from its prompt's end on are its generated tokens, the t-th of every request in one step. Returns the mean
    over steps and layers, per layer, and the steps counted (as many as the shortest request has)."""
    dec = [a[int(p):] for a, p in zip(arrays, prompt_tokens)]
    steps = min((len(d) for d in dec), default=0)
    if steps == 0 or not dec:
        return {"distinct_per_step": None, "per_layer": [], "steps": 0, "requests": len(dec)}
    layers = dec[0].shape[1]
    per_layer = []
    for layer in range(layers):
        counts = [len(np.unique(np.concatenate([d[t, layer].ravel() for d in dec]))) for t in range(steps)]
        per_layer.append(float(statistics.mean(counts)))
    return {"distinct_per_step": float(statistics.mean(per_layer)), "per_layer": per_layer, "steps": steps,
            "requests": len(dec)}


def routing_record(result: Mapping[str, Any], facts: Mapping[str, Any], *, concurrency: int, source: str) -> dict[str, Any]:
    """routing.json: the measured distinct experts per step beside spread routing's expectation for the same
    requests and the tie's (every token the same k experts)."""
    E, k = facts.get("num_experts"), facts.get("num_active_experts")
    spread = distinct_experts(float(E), float(k), float(concurrency)) if E and k else None
    return {**dict(result), "concurrency": concurrency, "experts": E, "top_k": k, "spread_per_step": spread,
            "tied_per_step": float(k) if k else None, "source": source}


__all__ = ["decode_routed", "distinct_per_step", "routing_record"]
