"""Physical limits of the hardware a run used: a sourced datasheet table, lower bounds on
decode (memory-bound) and prefill (compute-bound) time, and the efficiency of a run against
them. The numbers are vendor peaks, which real kernels do not reach (an H200 copies about
4.3 TB/s of its 4.8 TB/s): 60-80 % of a datasheet bound is good. Units: bytes, bytes/s
(`_Bps`), FLOP/s (`_flops`), seconds (`_s`)."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any

import pandas as pd

from ..measure.probe import measure_cpu_bandwidth
from ..tables import hardware

TB = 10**12

GB = 10**9

TFLOPS = 10**12

def _load_hardware() -> list[dict[str, Any]]:
    """data/hardware.yaml (datasheet units) in this module's units: bytes, bytes/s, FLOP/s."""
    out = []
    for h in hardware():
        out.append({"name": h["name"], "aliases": h["aliases"], "memory_type": h["memory_type"],
                    "memory_bytes": h["memory_GB"] * GB, "memory_bandwidth_Bps": h["memory_bandwidth_TBps"] * TB,
                    "bf16_dense_flops": h["bf16_dense_TFLOPS"] * TFLOPS,
                    "fp8_dense_flops": h["fp8_dense_TFLOPS"] * TFLOPS,
                    "sm_count": h.get("sm_count"), "boost_clock_hz": (h.get("boost_clock_MHz") or 0) * 1e6 or None,
                    "clock_source": h.get("clock_source"), "source": h["source"], "as_of": h["as_of"]})
    return out


#: vendor peaks, dense, each with its source and the date it was checked (data/hardware.yaml)
HARDWARE: list[dict[str, Any]] = _load_hardware()


def _norm(name: str) -> str:
    return " ".join(name.lower().replace("_", " ").replace("-", " ").split())


def get_hardware(name: str) -> dict[str, Any]:
    """The :data:`HARDWARE` entry whose name or alias matches ``name`` (case, ``-``/``_``
    and spacing ignored; an ``nvidia-smi`` name such as ``"NVIDIA H200"`` works).
    Raises KeyError listing the known names."""
    want = _norm(name)
    for hw in HARDWARE:
        if want == _norm(hw["name"]) or want in {_norm(a) for a in hw["aliases"]}:
            return dict(hw)
    raise KeyError(f"unknown hardware {name!r}; known: {[h['name'] for h in HARDWARE]}")


def local_cpu_entry(measured: Mapping[str, Any] | None = None, seconds: float = 2.0,
                    as_of: str | None = None) -> dict[str, Any]:
    """A :data:`HARDWARE`-shaped entry for this CPU from :func:`measure_cpu_bandwidth`
    (measured now unless ``measured`` is given). The measured float32 matmul rate stands
    in for every precision (``peak_flops``): the CPU engine computes bf16 through it or
    slower, so the prefill bound stays a lower bound only approximately."""
    m = dict(measured) if measured is not None else measure_cpu_bandwidth(seconds=seconds)
    return {
        "name": f"local CPU ({m.get('cpu_model') or 'unknown'}, {m.get('cpu_count')} cores)",
        "aliases": ["local", "cpu"],
        "memory_type": "host DRAM",
        "memory_bytes": None,
        "memory_bandwidth_Bps": float(m["copy_bandwidth_Bps"]),
        "bf16_dense_flops": None,
        "fp8_dense_flops": None,
        "peak_flops": float(m["matmul_f32_flops"]),
        "source": f"measured with numpy: copy of {m.get('array_bytes')} bytes (read+write counted), "
                  f"float32 matmul n={m.get('matmul_n')}, best of repeats",
        "as_of": as_of or time.strftime("%Y-%m-%d", time.gmtime()),  # a report passes the run's date
        "measured": m,
    }


def flops_for(hw: Mapping[str, Any], precision: str = "bf16") -> float:
    """Peak FLOP/s of ``hw`` for ``precision`` ("bf16", "fp16" = bf16, "fp8"), falling
    back to a measured ``peak_flops``. Raises KeyError when neither is known."""
    p = precision.lower()
    p = {"bfloat16": "bf16", "float16": "bf16", "fp16": "bf16", "half": "bf16",
         "float8_e4m3fn": "fp8", "float8": "fp8", "fp8_e4m3": "fp8"}.get(p, p)
    v = hw.get(f"{p}_dense_flops")
    if v is None:
        v = hw.get("peak_flops")
    if v is None:
        raise KeyError(f"{hw.get('name')!r} has no {p} FLOP/s and no peak_flops")
    return float(v)


def decode_bound_s_per_token(weight_bytes: float, kv_bytes_per_token: float, context_tokens: float,
                             batch: int, bandwidth_Bps: float) -> float:
    """Lower bound on the time of one decode step (= TPOT of every sequence in the batch):
    ``(weight_bytes + batch * context_tokens * kv_bytes_per_token) / bandwidth_Bps``.

    One step reads all weights once (shared by the batch) and each sequence's whole KV
    cache; every sequence gains one token per step, so this is also seconds per output
    token per request. Speculative decoding breaks the one-token-per-step assumption."""
    if bandwidth_Bps <= 0:
        raise ValueError("bandwidth_Bps must be > 0")
    step_bytes = float(weight_bytes) + float(batch) * float(context_tokens) * float(kv_bytes_per_token)
    return step_bytes / float(bandwidth_Bps)


def prefill_bound_s(active_params: float, prompt_tokens: float, flops: float) -> float:
    """Lower bound on prefill time: ``2 * active_params * prompt_tokens / flops`` (one
    multiply-add per parameter per token; attention's quadratic term is ignored)."""
    if flops <= 0:
        raise ValueError("flops must be > 0")
    return 2.0 * float(active_params) * float(prompt_tokens) / float(flops)


def _dtype_bytes(facts: Mapping[str, Any]) -> float:
    pc = facts.get("param_count")
    wb = facts.get("weight_bytes")
    if pc and wb:
        return float(wb) / float(pc)
    return {"float32": 4, "bfloat16": 2, "float16": 2, "float8_e4m3fn": 1}.get(str(facts.get("dtype")), 2)


def decode_weight_bytes(facts: Mapping[str, Any], batch: int = 1) -> float:
    """Weight bytes one decode step reads, from :func:`servelab.models.facts.model_facts`.

    Dense: every weight except the input embedding table (a lookup of ``batch`` rows;
    with tied embeddings the table is read in full as the lm_head). MoE (facts with
    ``num_experts``/``active_param_count``): the non-expert part plus the expected number
    of distinct experts that ``batch`` tokens touch per layer, ``E * (1 - (1 - k/E)^batch)``,
    assuming independent uniform routing (the real router is skewed, so this can
    overstate the bytes at large batch)."""
    b = _dtype_bytes(facts)
    total = float(facts["param_count"])
    emb = 0.0 if facts.get("tie_word_embeddings") else float(facts.get("embedding_param_count") or 0)
    E = facts.get("num_experts")
    k = facts.get("num_active_experts")
    active = facts.get("active_param_count")
    if E and k and active and E > k:
        E, k = float(E), float(k)
        per_expert = (total - float(active)) / (E - k)  # params of one expert summed over MoE layers
        fixed = float(active) - k * per_expert
        touched = E * (1.0 - (1.0 - k / E) ** max(1, int(batch)))
        return (fixed - emb + touched * per_expert) * b
    return (total - emb) * b


def prefill_matmul_params(facts: Mapping[str, Any]) -> float:
    """Parameters multiplied per prompt token in prefill: active parameters minus the
    embedding table (a lookup) and the lm_head (vLLM computes logits for the last
    position only)."""
    active = float(facts.get("active_param_count") or facts["param_count"])
    return active - float(facts.get("embedding_param_count") or 0) - float(facts.get("lm_head_param_count") or 0)


def roofline_efficiency(summary: pd.DataFrame, facts: Mapping[str, Any], hw: Mapping[str, Any],
                        precision: str | None = None, kv_bytes_per_token: float | None = None,
                        devices: int = 1) -> pd.DataFrame:
    """Measured decode and prefill speed of every summary level against the roofline.

    Decode, per level: the bound is :func:`decode_bound_s_per_token` with
    ``batch = concurrency``, weights from :func:`decode_weight_bytes` and the mean
    context during decode, ``prompt_tokens + output_tokens_p50 / 2``; the measurement is
    ``tpot_p50_s``. ``decode_efficiency_pct = bound / measured * 100``;
    ``implied_bandwidth_Bps`` is the bytes of one step over the measured TPOT.

    Prefill, at the lowest concurrency only (concurrency 1 normally): the bound is
    :func:`prefill_bound_s` over :func:`prefill_matmul_params` and the level's median
    prompt tokens, the measurement ``ttft_p50_s`` (which also holds HTTP, queueing and
    the first decode step, so short prompts look inefficient); other rows are NaN.

    ``precision`` picks the FLOP/s column (default from the model dtype: fp8 weights ->
    "fp8", else "bf16"); ``kv_bytes_per_token`` defaults to the facts' value. ``devices``
    is how many of ``hw`` the engine spans (tensor/pipeline/data parallel): the bound uses
    their summed bandwidth and FLOP/s (tensor parallel shards the bytes across them).
    """
    cols = ["config", "bucket", "concurrency", "prompt_tokens", "context_tokens", "tpot_p50_s",
            "decode_bound_s_per_token", "decode_efficiency_pct", "implied_bandwidth_Bps", "ttft_p50_s",
            "prefill_bound_s", "prefill_efficiency_pct", "hardware"]
    if summary is None or summary.empty:
        return pd.DataFrame(columns=cols)
    if precision is None:
        precision = "fp8" if "float8" in str(facts.get("dtype", "")) else "bf16"
    n = max(1, int(devices))
    flops = flops_for(hw, precision) * n
    bw = float(hw["memory_bandwidth_Bps"]) * n
    kv = float(kv_bytes_per_token if kv_bytes_per_token is not None else facts["kv_cache_bytes_per_token"])
    mm_params = prefill_matmul_params(facts)
    rows = []
    for _, r in summary.iterrows():
        c = int(r["concurrency"])
        prompt = float(r["prompt_tokens"])
        out = float(r.get("output_tokens_p50", r.get("target_output_tokens", 0)) or 0)
        ctx = prompt + out / 2.0
        wbytes = decode_weight_bytes(facts, batch=c)
        bound = decode_bound_s_per_token(wbytes, kv, ctx, c, bw)
        tpot = float(r["tpot_p50_s"]) if pd.notna(r.get("tpot_p50_s")) else math.nan
        step_bytes = wbytes + c * ctx * kv
        cmin = int(summary.loc[summary["config"] == r["config"], "concurrency"].min())
        ttft = float(r["ttft_p50_s"]) if pd.notna(r.get("ttft_p50_s")) else math.nan
        pbound = prefill_bound_s(mm_params, prompt, flops) if c == cmin else math.nan
        rows.append({
            "config": r["config"], "bucket": r["bucket"], "concurrency": c, "prompt_tokens": prompt,
            "context_tokens": ctx, "tpot_p50_s": tpot, "decode_bound_s_per_token": bound,
            "decode_efficiency_pct": bound / tpot * 100 if tpot > 0 else math.nan,
            "implied_bandwidth_Bps": step_bytes / tpot if tpot > 0 else math.nan,
            "ttft_p50_s": ttft, "prefill_bound_s": pbound,
            "prefill_efficiency_pct": pbound / ttft * 100 if c == cmin and ttft > 0 else math.nan,
            "hardware": hw.get("name") if n == 1 else f"{n} x {hw.get('name')}",
        })
    return pd.DataFrame(rows, columns=cols)
