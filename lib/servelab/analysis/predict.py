"""Predict, then measure: what the model facts and the hardware table say a configuration should
do, computed before it runs (stored in run.json as `prediction`) or, for runs published before
predictions existed, at render time from the same committed facts (labelled so).

Four numbers for one request shape (input x output tokens): the c=1 TPOT from the
memory-bandwidth roofline; the KV-limited concurrency (KV tokens the budget holds over the
tokens one request needs, capped by max-num-seqs); the prefill rate from the FLOP bound; and the
capacity at SLO they imply: the most concurrent requests whose decode step still meets the TPOT
target, turned into a request rate by Little's law, and capped by the compute every token needs.
All of them are bounds a real engine does not reach; the error against the measurement is the
evidence (`symptom_evidence`). Units: seconds, tokens, tokens/s, requests/s. Not for drawing or
words (`report.capacity`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ..engines.flags import engine_args as args_of, get_flag
from ..models.facts import kv_bytes_per_token
from .kv import flag_kv_tokens, kv_block
from .roofline import (decode_bound_s_per_token, decode_weight_bytes, flops_for, get_hardware, local_cpu_entry,
                       prefill_bound_s, prefill_matmul_params)

FORMAT_VERSION = 1

# gpu-memory-utilization's share that is not KV cache (activations, graphs, allocator): vLLM
# profiles it at start; the prediction leaves it out, so it is an upper bound on KV tokens.
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9


def hardware_of(run: Mapping[str, Any]) -> tuple[dict[str, Any] | None, int]:
    """The hardware row a run used and how many of it: the measured CPU, else the engine's GPUs."""
    if run.get("hardware_measured"):
        return local_cpu_entry(run["hardware_measured"], as_of=str(run.get("started_at", ""))[:10]), 1
    gpus = run.get("gpus_used") or (run.get("client_host") or {}).get("gpus") or []
    if not gpus:
        return None, 1
    try:
        hw = get_hardware(gpus[0]["name"])
    except KeyError:
        return None, 1
    args = args_of((run.get("engine_params") or {}).get("args"))
    n = int(get_flag(args, "tensor-parallel-size") or 1) * int(get_flag(args, "pipeline-parallel-size") or 1)
    return hw, max(1, n)


def kv_tokens(facts: Mapping[str, Any], args: Mapping[str, Any], hw: Mapping[str, Any] | None, n: int) -> tuple[float, str]:
    """KV-cache tokens the engine's flags allow, and from which flag (forced blocks, a byte
    budget, or the GPU memory share left after the weights)."""
    bpt = kv_bytes_per_token(facts, get_flag(args, "kv-cache-dtype") or "auto", n)
    block = kv_block(args)
    forced = flag_kv_tokens(args, bpt)
    if forced:
        return forced
    if hw and hw.get("memory_bytes"):
        util = float(get_flag(args, "gpu-memory-utilization") or DEFAULT_GPU_MEMORY_UTILIZATION)
        free = util * float(hw["memory_bytes"]) - float(facts["weight_bytes"]) / n
        return float(max(0.0, free) // (bpt * block) * block), "gpu-memory-utilization"
    return math.nan, "unknown"


def predict(facts: Mapping[str, Any], hw: Mapping[str, Any], n: int, args: Mapping[str, Any],
            input_tokens: int, output_tokens: int, slo: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The four predictions for one request shape (see the module docstring)."""
    slo = dict(slo or {})
    bw = float(hw["memory_bandwidth_Bps"]) * n
    precision = "fp8" if "float8" in str(facts.get("dtype", "")) else "bf16"
    flops = flops_for(hw, precision) * n
    kv_bpt = float(kv_bytes_per_token(facts, get_flag(args, "kv-cache-dtype") or "auto"))
    ctx = input_tokens + output_tokens / 2.0
    per_request = float(input_tokens + output_tokens)
    tpot1 = decode_bound_s_per_token(decode_weight_bytes(facts, 1), kv_bpt, ctx, 1, bw)
    kv_tok, kv_from = kv_tokens(facts, args, hw, n)
    seqs = get_flag(args, "max-num-seqs") or get_flag(args, "max-running-requests")
    c_kv = kv_tok / per_request if kv_tok == kv_tok else math.nan
    limits = {"kv": math.floor(c_kv) if c_kv == c_kv else math.inf,
              "max-num-seqs": int(seqs) if seqs else math.inf}
    mm = prefill_matmul_params(facts)
    prefill_tps = flops / (2.0 * mm)
    ttft1 = prefill_bound_s(mm, input_tokens, flops)
    tpot_target, ttft_target = slo.get("tpot_p95_s"), slo.get("ttft_p95_s")
    if tpot_target:
        # the largest batch whose bound step time still meets the TPOT target (weights grow with
        # the batch only for MoE; solve on the dense weight bytes and check)
        w = decode_weight_bytes(facts, 1)
        limits["tpot"] = max(0, math.floor((tpot_target * bw - w) / (ctx * kv_bpt)))
    c = min(limits.values())
    binding = min(limits, key=lambda k: limits[k])
    out: dict[str, Any] = {
        "format_version": FORMAT_VERSION, "hardware": hw.get("name") if n == 1 else f"{n} x {hw.get('name')}",
        "bucket": f"in{input_tokens}-out{output_tokens}", "input_tokens": input_tokens,
        "output_tokens": output_tokens, "tpot_c1_s": tpot1, "ttft_c1_s": ttft1, "prefill_tps": prefill_tps,
        "kv_tokens": kv_tok, "kv_from": kv_from, "kv_concurrency": c_kv,
        "max_num_seqs": int(seqs) if seqs else None, "slo": slo,
    }
    if c == math.inf or c < 1 or (ttft_target and ttft1 > ttft_target):
        out.update(capacity_rps=0.0 if c != math.inf else math.nan, capacity_concurrency=c if c != math.inf else None,
                   capacity_binding="ttft" if ttft_target and ttft1 > ttft_target else binding)
        return out
    tpot_c = decode_bound_s_per_token(decode_weight_bytes(facts, int(c)), kv_bpt, ctx, int(c), bw)
    e2e = ttft1 + output_tokens * tpot_c
    rate_decode = c / e2e  # Little's law at the concurrency limit
    rate_compute = flops / (2.0 * mm * per_request)  # every prompt and output token costs 2 x params FLOPs
    rate = min(rate_decode, rate_compute)
    out.update(capacity_rps=rate, capacity_concurrency=int(c), capacity_output_tps=rate * output_tokens,
               capacity_binding=binding if rate_decode <= rate_compute else "compute")
    return out


def predict_run(run: Mapping[str, Any], input_tokens: int, output_tokens: int,
                slo: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
    """`predict` from what a run record holds (model facts, engine args, hardware); None when the
    facts or the hardware are unknown (an attached server without a model directory)."""
    facts = (run.get("model") or {}).get("facts")
    hw, n = hardware_of(run)
    if not facts or not hw or not facts.get("param_count"):
        return None
    args = args_of((run.get("engine_params") or {}).get("args"))
    return predict(facts, hw, n, args, input_tokens, output_tokens, slo)


def errors(pred: Mapping[str, Any], measured: Mapping[str, float]) -> dict[str, float]:
    """Measured against predicted, in percent ((measured - predicted) / predicted), per quantity."""
    out = {}
    for k, v in measured.items():
        p = pred.get(k)
        if p is None or v is None or not (isinstance(p, (int, float)) and p == p and p) or v != v:
            out[k] = math.nan
        else:
            out[k] = (float(v) - float(p)) / float(p) * 100.0
    return out


def symptom_evidence(pred: Mapping[str, Any], measured: Mapping[str, float]) -> list[tuple[str, dict[str, Any]]]:
    """Large errors as evidence for the symptoms: (key, values) pairs the report words.
    Decode more than 3x the bandwidth bound at c=1 -> kernel or launch overhead; the KV cache
    limiting before the predicted concurrency (server's KV tokens below the prediction by > 10 %,
    or requests waiting at a lower concurrency) -> fragmentation or a mis-set budget."""
    out = []
    t_m, t_p = measured.get("tpot_c1_s"), pred.get("tpot_c1_s")
    if t_m and t_p and t_m == t_m and t_m > 3 * t_p:
        out.append(("decode_far_below_bound", {"ratio": t_m / t_p}))
    k_m, k_p = measured.get("kv_concurrency"), pred.get("kv_concurrency")
    if k_m and k_p and k_m == k_m and k_p == k_p and k_m < 0.9 * k_p:
        out.append(("kv_limited_early", {"measured": k_m, "predicted": k_p}))
    return out
