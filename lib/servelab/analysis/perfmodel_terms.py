"""Engine terms of the performance model (`analysis.perfmodel`): costs of one engine setting that a
diagnosis measured and the calibration's small models cannot show, each a dated entry of
`data/engine_terms.yaml` naming its study, the runs it was fitted on and the run held out; the rule
that says when a configuration pays one (engine, attention kind, KV-cache dtype, attention backend,
machine); and the fits that turn a study's runs into a term. Also the MoE prefill term, which a
calibration entry carries once a TTFT sweep measured it (`fit_moe_prefill`). The data file is read
by `tables`; not for the model's arithmetic (`perfmodel`) nor for loading studies (benchmarks/engine_terms.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from ..engines.flags import get_flag
from ..models.facts import kv_bytes_per_token
from ..tables import engine_terms

DEFAULT_BACKEND = "default"  # the flag unset: the engine picks (SGLang on Hopper with MLA: FA3)


def load_terms(path: Path | str | None = None) -> list[dict[str, Any]]:
    """Every engine term of the data file."""
    return [dict(t) for t in engine_terms(path)]


def _norm(s: Any) -> str:
    return " ".join(str(s or "").lower().replace("nvidia", "").replace("-", " ").split())


def attention_backend(args: Mapping[str, Any]) -> str:
    """The decode attention backend the flags name (SGLang's decode-attention-backend or
    attention-backend), or "default"."""
    return str(get_flag(args, "decode-attention-backend") or get_flag(args, "attention-backend") or DEFAULT_BACKEND)


def applies(term: Mapping[str, Any], engine: str, args: Mapping[str, Any], facts: Mapping[str, Any],
            machine: str | None) -> bool:
    """Whether a configuration pays this term: every condition of its `when` holds."""
    w = term.get("when") or {}
    kv_dtype = str(get_flag(args, "kv-cache-dtype") or "auto").lower()
    checks = (
        ("engine", lambda v: v == engine),
        ("attention", lambda v: v == (facts.get("attention") or ("mla" if facts.get("kv_lora_rank") else "gqa"))),
        ("kv_cache_dtype", lambda v: kv_dtype.startswith(str(v).lower())),
        ("attention_backend", lambda v: attention_backend(args) in [str(x) for x in v]),
        ("machine", lambda v: _norm(v) == _norm(machine)),
    )
    return all(check(w[key]) for key, check in checks if key in w)


def pool_bytes(facts: Mapping[str, Any], pool_tokens: float, kv_dtype: str) -> float:
    """Bytes of a KV pool of `pool_tokens` tokens in the configuration's KV dtype (one GPU)."""
    return float(pool_tokens) * float(kv_bytes_per_token(facts, kv_dtype))


def step_terms(engine: str, args: Mapping[str, Any], facts: Mapping[str, Any], machine: str | None,
               pool_tokens: float, kv_dtype: str, path: Path | str | None = None) -> list[dict[str, Any]]:
    """The engine terms this configuration pays per decode step: id, seconds (NaN when the pool
    size it needs is unknown), what it is and where it comes from."""
    out = []
    for t in load_terms(path):
        if not applies(t, engine, args, facts, machine):
            continue
        law = t.get("per_step") or {}
        pool = pool_bytes(facts, pool_tokens, kv_dtype) if pool_tokens == pool_tokens else math.nan
        s = float(law.get("fixed_s", 0.0)) + float(law.get("pool_byte_s", 0.0)) * pool
        src = t.get("source") or {}
        out.append({"id": t["id"], "seconds": s, "pool_bytes": pool, "what": str(t.get("what", "")).strip(),
                    "source": f"{src.get('study')}: fitted on {', '.join(src.get('fitted_on') or [])} "
                              f"(measured {src.get('measured_at')}), held out {', '.join(src.get('held_out') or [])}"})
    return out


def _line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float, float]:
    """(intercept, slope, r2) of the least-squares line through the points."""
    x, y = np.asarray(xs, float), np.asarray(ys, float)
    if len(set(xs)) < 2:
        raise ValueError("a line needs points at two values at least")
    b, a = np.polyfit(x, y, 1)
    ss = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float(((y - (a + b * x)) ** 2).sum()) / ss if ss > 0 else 1.0
    return float(a), float(b), r2


def fit_pool_term(points: Sequence[Mapping[str, float]]) -> dict[str, Any]:
    """A per-step cost that grows with the KV pool: `points` of pool_bytes, measured_s (c=1 TPOT)
    and base_s (the model's prediction without the term); the residuals fitted as
    fixed_s + pool_byte_s x pool bytes by least squares."""
    a, b, r2 = _line([p["pool_bytes"] for p in points], [p["measured_s"] - p["base_s"] for p in points])
    return {"fixed_s": a, "pool_byte_s": b, "r2": r2, "n": len(points)}


# -- MoE prefill ------------------------------------------------------------------------------------

def moe_prefill(entry: Mapping[str, Any], engine: str) -> dict[str, Any] | None:
    """The engine's MoE prefill term of a calibration entry (`engines.<engine>.moe_prefill`:
    layer_s + token_layer_s x prompt tokens per MoE layer, above the roofline), or None."""
    t = ((entry.get("engines") or {}).get(engine) or {}).get("moe_prefill")
    return dict(t) if t else None


def moe_prefill_seconds(term: Mapping[str, Any], moe_layers: int, tokens: float) -> float:
    return float(moe_layers) * (float(term.get("layer_s", 0.0)) + float(term.get("token_layer_s", 0.0)) * tokens)


def fit_moe_prefill(points: Sequence[Mapping[str, float]]) -> dict[str, Any]:
    """The MoE prefill term from a TTFT sweep: `points` of tokens (prompt length), moe_layers and
    residual_s (the MoE shape's measured TTFT less the model's, less the same residual of a dense
    shape at that length, which holds what is not MoE: HTTP, tokenization, the engine's own dense
    prefill), fitted per MoE layer as layer_s + token_layer_s x tokens."""
    a, b, r2 = _line([p["tokens"] for p in points], [p["residual_s"] / p["moe_layers"] for p in points])
    return {"layer_s": a, "token_layer_s": b, "r2": r2, "n": len(points)}


# -- the engine's fixed cost of a request ----------------------------------------------------------

def fit_request_cost(points: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The engine's fixed cost of one request from measured TTFTs at concurrency 1: `points` of measured_s
    (a level's median TTFT) and model_s (the model's prefill steps for that prompt, without this term); the
    cost is the median of measured - model (robust to the one level a neighbour or a long prompt's attention
    disturbed), with the residuals kept for the band."""
    res = sorted(float(p["measured_s"]) - float(p["model_s"]) for p in points)
    if len(res) < 3:
        raise ValueError("a request cost needs TTFTs of three levels or more")
    med = float(np.median(res))
    return {"request_s": med, "residuals_s": [r - med for r in res], "n": len(res)}


def fit_graph_prefill(points: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The host's cost per latent-attention layer of a prefill step inside captured graphs, beyond the graph's floor:
    vLLM captures a step that prefills as pieces and runs each layer's attention between them, launched from the
    host, and latent attention's prefill launches many kernels (the latent KV's up-projection, the split, the rope
    part's concatenation, the attention). From one study's TTFTs at concurrency 1 prefilled in a graph (`points`
    with measured_s, model_s, the step's floor cpu_s, `mla_layers` and `dense`): its request cost r0 is the median
    residual (measured - model) of the levels with neither latent attention nor experts; each latent-attention
    level's cost per layer is (measured - r0 - floor) / layers. Raises ValueError with fewer than two of either."""
    base = [float(p["measured_s"]) - float(p["model_s"]) for p in points if p.get("dense")]
    mla = [p for p in points if p.get("mla_layers")]
    if len(base) < 2 or len(mla) < 2:
        raise ValueError("two levels of a latent-attention model and two of a dense one, prefilled in a graph")
    r0 = float(np.median(base))
    return {"request_s": r0, "points": [
        {**{k: p[k] for k in ("study", "config", "bucket", "tokens", "measured_s", "started_at") if k in p},
         "layer_s": max(0.0, (float(p["measured_s"]) - r0 - float(p["cpu_s"])) / float(p["mla_layers"]))}
        for p in mla]}


def fit_launch_wait(points_at: Callable[[float], Sequence[Mapping[str, Any]]],
                    grid: Sequence[float] = tuple(i / 20 for i in range(21))) -> float | None:
    """The share of the GPU's work a launched prefill step waits on (`perfmodel.launched_step`): the value whose
    launched levels (`how` "launched") leave the same median residual (measured - model) as the levels prefilled
    inside a captured graph, which the launches do not touch; `points_at(w)` gives the levels under wait w. None
    with fewer than two levels of either kind (the engine's launches then run ahead of the GPU: 0)."""
    def gap(w: float) -> float | None:
        pts = points_at(w)
        g = [float(p["measured_s"]) - float(p["model_s"]) for p in pts if p.get("how") == "graph"]
        l_ = [float(p["measured_s"]) - float(p["model_s"]) for p in pts if p.get("how") == "launched"]
        return float(np.median(l_) - np.median(g)) if len(g) >= 2 and len(l_) >= 2 else None
    gaps = [(w, gap(w)) for w in grid]
    if any(g is None for _, g in gaps):
        return None
    return min(gaps, key=lambda wg: abs(wg[1]))[0]


__all__ = ["DEFAULT_BACKEND", "applies", "attention_backend", "fit_graph_prefill", "fit_moe_prefill", "fit_pool_term", "fit_launch_wait", "fit_request_cost",
           "load_terms", "moe_prefill", "moe_prefill_seconds", "pool_bytes", "step_terms"]
