"""The physics check on a measured configuration: no step of an engine can be faster than its minimum
bytes over the GPU's peak bandwidth, nor a prefill faster than its minimum FLOPs over the peak FLOP/s
(the datasheet's, data/hardware.yaml). A level measured faster than its floor is not a speed to publish:
something made the work smaller than the configuration says, and the flag names what can (issue #59).

- Decode, per level of c concurrent requests: the weights a step reads (a MoE layer's non-expert part
  and the experts its tokens touch under spread routing, E (1 - (1 - k/E)^n) of E for n distinct tokens:
  each request its own token, or one when the workload sends identical requests decoded deterministically)
  plus every sequence's KV cache, over the peak bandwidth of the engine's GPUs.
- Prefill, at concurrency 1: 2 x the active matmul parameters x the prompt's tokens, over the peak FLOP/s.

The likely causes of a level below its floor, each said with what supports it: a MoE router that ties
under dummy weights (the engine profile's rule, `analysis.perfmodel.router_ties`, or for a dummy-weight
MoE without a known rule, a likely one), prefix-cache hits (cached tokens reported, or a workload that
shares prefixes), speculative decoding (several tokens per step), a model other than the one counted (the
engine's own "Model loading took" against the facts' weight bytes). An engine's routing report (the
experts each decode step's tokens took, `analysis.routing`) confirms or rules out the first.

No I/O: the report layer passes the frames, the run record and what it read (`report.verdicts`). A CPU
has no datasheet peak here: its levels are not checked (said so)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pandas as pd

from ..models.facts import kv_read_bytes_per_token
from .perfmodel_parallel import distinct_experts
from .roofline import decode_weight_bytes, flops_for, prefill_matmul_params

#: a level is flagged when it is this much faster than its floor (the datasheets round their peaks)
TOLERANCE = 0.02
TIES, PREFIX, SPECULATIVE, WRONG_MODEL = "router_ties", "prefix_cache", "speculative", "wrong_model"


def decode_floor(facts: Mapping[str, Any], hw: Mapping[str, Any], devices: int, *, batch: int, ctx: float,
                 distinct: float, kv_dtype: str = "auto") -> dict[str, Any]:
    """The least time one decode step of `batch` sequences of `ctx` tokens of context can take: its bytes
    (weights for `distinct` distinct tokens under spread routing, every sequence's KV read) over the peak
    bandwidth of `devices` GPUs."""
    wbytes = decode_weight_bytes(facts, max(1, int(round(distinct))))
    kv = float(kv_read_bytes_per_token(facts, ctx, kv_dtype, 1)) * batch * ctx
    bw = float(hw["memory_bandwidth_Bps"]) * max(1, devices)
    E, k = facts.get("num_experts"), facts.get("num_active_experts")
    touched = distinct_experts(float(E), float(k), max(1.0, distinct)) if E and k else None
    return {"bytes": wbytes + kv, "weight_bytes": wbytes, "kv_bytes": kv, "floor_s": (wbytes + kv) / bw,
            "bandwidth_Bps": bw, "experts_touched": touched, "experts": E, "distinct_tokens": distinct}


def prefill_floor(facts: Mapping[str, Any], hw: Mapping[str, Any], devices: int, tokens: float) -> dict[str, Any]:
    """The least time a prefill of `tokens` prompt tokens can take: 2 x active matmul parameters x tokens
    over the peak FLOP/s of `devices` GPUs (attention's quadratic term left out: a lower floor)."""
    prec = "fp8" if "float8" in str(facts.get("dtype", "")) else "bf16"
    flops = 2.0 * prefill_matmul_params(facts) * float(tokens)
    peak = flops_for(hw, prec) * max(1, devices)
    return {"flops": flops, "floor_s": flops / peak, "flops_per_s": peak}


def causes(facts: Mapping[str, Any], *, ties: str | None, dummy: bool, prefix_tokens: float, shared_prefix: bool,
           speculative: bool, loaded_bytes: float | None, routing: Mapping[str, Any] | None = None,
           metric: str = "tpot") -> list[dict[str, str]]:
    """The likely causes of a level faster than physics, most likely first, each with its evidence."""
    out = []
    moe = bool(facts.get("num_experts"))
    if moe and metric == "tpot":
        if routing and routing.get("distinct_per_step") is not None:
            d, spread = float(routing["distinct_per_step"]), routing.get("spread_per_step")
            tied = spread is not None and d < 0.5 * float(spread)
            out.append({"cause": TIES, "evidence": f"the engine reported {d:.1f} distinct experts per layer per decode "
                        f"step at {routing.get('concurrency')} requests where spread routing touches "
                        f"{float(spread or 0):.1f} ({'confirmed' if tied else 'not confirmed'}: {routing.get('source')})",
                        "say": "routing_confirmed" if tied else "routing_not_confirmed",
                        "values": {"d": round(d, 1), "spread": round(float(spread or 0), 1),
                                   "c": routing.get("concurrency")}})
        elif ties:
            out.append({"cause": TIES, "evidence": f"known for this engine: {ties}", "say": "ties_known", "values": {}})
        elif dummy:
            out.append({"cause": TIES, "evidence": "likely: dummy weights make a router's logits nearly equal, and this "
                        "engine version's rule is not known; an engine routing report would confirm it",
                        "say": "ties_likely", "values": {}})
    if prefix_tokens > 0 or shared_prefix:
        ev = (f"{prefix_tokens:,.0f} prompt tokens per request served from the prefix cache" if prefix_tokens > 0
              else "the workload shares prompt prefixes")
        out.append({"cause": PREFIX, "evidence": ev, "say": "prefix_tokens" if prefix_tokens > 0 else "prefix_shared",
                    "values": {"n": round(prefix_tokens)}})
    if speculative:
        out.append({"cause": SPECULATIVE, "evidence": "speculative decoding: accepted drafts emit several tokens per step",
                    "say": "speculative", "values": {}})
    wb = float(facts.get("weight_bytes") or 0)
    if loaded_bytes and wb and abs(loaded_bytes - wb) / wb > 0.05:
        out.append({"cause": WRONG_MODEL, "evidence": f"the engine loaded {loaded_bytes / 2**30:.2f} GiB of weights where "
                    f"the model's facts count {wb / 2**30:.2f} GiB", "say": "loaded_other",
                    "values": {"loaded": round(loaded_bytes / 2**30, 2), "counted": round(wb / 2**30, 2)}})
    elif not out:
        out.append({"cause": WRONG_MODEL, "evidence": "no other cause applies: check that the engine served the "
                    "config the facts were counted from" + (f" (it loaded {loaded_bytes / 2**30:.2f} GiB, as counted)"
                                                              if loaded_bytes else ""), "say": "no_other", "values": {}})
    return out


def check_levels(summary: pd.DataFrame, facts: Mapping[str, Any], hw: Mapping[str, Any] | None, devices: int, *,
                 config: str, identical: bool, kv_dtype: str = "auto", ties: str | None = None, dummy: bool = False,
                 speculative: bool = False, prefix: Mapping[str, float] | None = None, shared_prefix: bool = False,
                 loaded_bytes: float | None = None, routing: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Every closed-loop level of one configuration against its floors: {checked, flags, not_checked}. A flag:
    config, level, metric (tpot / ttft), measured_s, floor_s, how much faster, the bytes or FLOPs, causes.
    `prefix`: cached prompt tokens per request by level label."""
    if hw is None or not hw.get("bf16_dense_flops"):
        return {"checked": 0, "flags": [], "not_checked": "no datasheet peak for this machine (data/hardware.yaml)"}
    if summary is None or summary.empty or not facts.get("param_count"):
        return {"checked": 0, "flags": [], "not_checked": "no measured level or no model facts"}
    flags, checked = [], 0
    s = summary[summary["rate_rps"] <= 0] if "rate_rps" in summary else summary
    cmin = {b: int(g["concurrency"].min()) for b, g in s.groupby("bucket")}
    for r in s.itertuples():
        c = int(r.concurrency)
        level = f"{r.bucket} c={c}"
        ctx = float(r.prompt_tokens) + float(getattr(r, "output_tokens_p50", 0) or 0) / 2.0
        got = {"tpot": float(r.tpot_p50_s) if pd.notna(r.tpot_p50_s) else math.nan,
               "ttft": float(r.ttft_p50_s) if pd.notna(r.ttft_p50_s) else math.nan}
        floors = {"tpot": decode_floor(facts, hw, devices, batch=c, ctx=ctx, distinct=1 if identical else c,
                                       kv_dtype=kv_dtype)}
        if c == cmin.get(r.bucket, c):
            floors["ttft"] = prefill_floor(facts, hw, devices, float(r.prompt_tokens))
        for metric, fl in floors.items():
            if not got[metric] == got[metric]:
                continue
            checked += 1
            if got[metric] < fl["floor_s"] * (1.0 - TOLERANCE):
                cs = causes(facts, ties=ties, dummy=dummy, prefix_tokens=(prefix or {}).get(level, 0.0),
                            shared_prefix=shared_prefix, speculative=speculative and metric == "tpot",
                            loaded_bytes=loaded_bytes, routing=routing, metric=metric)
                flags.append({"config": config, "level": level, "bucket": r.bucket, "concurrency": c, "metric": metric,
                              "measured_s": got[metric], "floor_s": fl["floor_s"],
                              "faster_than_floor": fl["floor_s"] / got[metric],
                              **({"bytes": fl["bytes"], "experts_touched": fl["experts_touched"], "experts": fl["experts"]}
                                 if metric == "tpot" else {"flops": fl["flops"]}),
                              "causes": cs})
    return {"checked": checked, "flags": flags, "not_checked": None}


__all__ = ["PREFIX", "SPECULATIVE", "TIES", "TOLERANCE", "WRONG_MODEL", "causes", "check_levels", "decode_floor",
           "prefill_floor"]
