"""Seed 002's table "observation -> first check", filled from one configuration's data."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pandas as pd

from ..summary import LEVEL_KEYS
from .kv import kv_verdict
from .prefill import fit_prefill
from .saturation import knee, saturation, slo_check
from .stats import _num, _ordered, _pct_change

# Seed 002's table "observation -> first check", in English.
SYMPTOM_FIRST_CHECKS: dict[str, str] = {
    "TTFT grows with prompt length":
        "prefill rate, queue time, prefix-cache hit rate, graph or compile warm-up",
    "Decode slow even at concurrency 1":
        "runtime model path, kernel support, precision, GPU utilisation, communication overhead",
    "Aggregate tok/s plateaus as concurrency rises":
        "KV-cache capacity, scheduler batching, memory bandwidth, parallel topology",
    "Aggregate improves while p95 latency spikes":
        "batch size, queueing policy, request-length mix, service objective",
    "Long prompts evict useful active requests":
        "KV-cache residency, cache allocation, context distribution, host-memory traffic",
}

SPIKE_FACTOR = 2.0  # p95 latency growth between adjacent levels that counts as a spike

SLOW_DECODE_FRAC = 0.5  # c=1 decode below this fraction of the roofline bound is "slow"

PROMPT_TTFT_FACTOR = 2.0  # TTFT at the longest prompt over the shortest


def _pick_fit(fit: Any, config: str) -> Mapping[str, Any] | None:
    if not fit:
        return None
    if isinstance(fit, Mapping) and "prefill_tps" in fit:
        return fit
    if isinstance(fit, Mapping):
        return fit.get(config)
    return None


def symptoms(summary: pd.DataFrame, samples: pd.DataFrame | None, fit: Any = None, slo: Any = None,
             decode_bound_s_per_token: float | Mapping[str, float] | None = None,
             config: str | None = None) -> pd.DataFrame:
    """Seed 002's symptom table for one configuration, filled from this run.

    Columns: observation | present ("yes", "no" or "n/a" when the data cannot tell) |
    evidence (the numbers) | first_check (seed 002's first check). Rows and rules:

    * TTFT grows with prompt length -- at concurrency 1, median TTFT at the longest prompt
      > 2x that at the shortest, and (when the fit has errors) the fitted slope's 95 %
      interval is above 0. ``fit`` is :func:`fit_prefill`'s output (or one of its dicts);
      computed from ``summary`` when None. n/a with fewer than 2 prompt lengths.
    * Decode slow even at concurrency 1 -- per-request decode tok/s (p50) at concurrency 1
      < 50 % of the roofline bound ``1 / decode_bound_s_per_token`` (a number, or a dict
      per bucket, from :mod:`servelab.hardware`); n/a without a bound or without c=1.
    * Aggregate tok/s plateaus as concurrency rises -- :func:`knee` finds a knee below the
      top level in some bucket; n/a with a single concurrency.
    * Aggregate improves while p95 latency spikes -- between adjacent levels aggregate
      tok/s grows while p95 E2E or p95 TTFT grows > 2x (``slo``, if given, says whether
      the spiking level still meets it).
    * Long prompts evict useful active requests -- :func:`kv_verdict` is limited
      (preemptions, or requests waiting while KV usage >= 90 %); n/a without /metrics.

    ``config`` selects the configuration when ``summary`` holds several.
    """
    cfgs = _ordered(summary["config"]) if summary is not None and not summary.empty else []
    if config is None:
        if len(cfgs) > 1:
            raise ValueError(f"summary holds several configurations {cfgs}; pass config=")
        config = cfgs[0] if cfgs else None
    s = summary[summary["config"] == config] if config is not None else pd.DataFrame(columns=LEVEL_KEYS)
    rows: list[dict[str, str]] = []

    def add(obs: str, present: str, evidence: str) -> None:
        rows.append({"observation": obs, "present": present, "evidence": evidence,
                     "first_check": SYMPTOM_FIRST_CHECKS[obs]})

    # 1. TTFT vs prompt length
    obs = "TTFT grows with prompt length"
    f = _pick_fit(fit, str(config)) if fit is not None else None
    if f is None and len(s):
        f = fit_prefill(s, concurrency=1).get(str(config))
    if not f or f.get("distinct_prompt_lengths", 0) < 2 or not math.isfinite(_num(f.get("ttft_longest_over_shortest"))):
        add(obs, "n/a", "fewer than 2 prompt lengths measured at concurrency 1")
    else:
        ratio = float(f["ttft_longest_over_shortest"])
        has_se = math.isfinite(_num(f.get("slope_se")))
        sig = bool(f.get("slope_significant")) if has_se else True
        present = ratio > PROMPT_TTFT_FACTOR and sig
        ev = (f"TTFT p50 at c=1: {f['ttft_shortest_s'] * 1000:.0f} ms at {f['prompt_tokens_shortest']:.0f} tok -> "
              f"{f['ttft_longest_s'] * 1000:.0f} ms at {f['prompt_tokens_longest']:.0f} tok ({ratio:.1f}x)")
        if math.isfinite(_num(f.get("prefill_tps"))):
            se = f" ± {f['prefill_tps_se']:,.0f}" if math.isfinite(_num(f.get("prefill_tps_se"))) else ""
            ev += (f"; fit: prefill {f['prefill_tps']:,.0f}{se} tok/s, overhead {f['overhead_s'] * 1000:.0f} ms, "
                   f"r2 {f['r2']:.3f}, n={f['n']}")
        elif f.get("note"):
            ev += f"; {f['note']}"
        if has_se and not sig:
            ev += "; slope not significant at 95 %"
        add(obs, "yes" if present else "no", ev)

    # 2. slow decode at c=1
    obs = "Decode slow even at concurrency 1"
    c1 = s[s["concurrency"] == 1] if len(s) else s
    if decode_bound_s_per_token is None:
        add(obs, "n/a", "no roofline bound given (servelab.hardware.decode_bound_s_per_token)")
    elif c1.empty:
        add(obs, "n/a", "concurrency 1 not measured")
    else:
        parts, slow = [], False
        for _, r in c1.iterrows():
            bound = (decode_bound_s_per_token.get(r["bucket"]) if isinstance(decode_bound_s_per_token, Mapping)
                     else decode_bound_s_per_token)
            if bound is None or not bound > 0:
                continue
            bound_tps = 1.0 / float(bound)
            meas = _num(r["decode_tps_p50"])
            frac = meas / bound_tps
            slow = slow or frac < SLOW_DECODE_FRAC
            parts.append(f"{r['bucket']}: {meas:.1f} tok/s vs bound {bound_tps:.1f} tok/s ({frac:.0%})")
        if parts:
            add(obs, "yes" if slow else "no", "; ".join(parts) + f" (slow below {SLOW_DECODE_FRAC:.0%})")
        else:
            add(obs, "n/a", "no bound for the measured buckets")

    # 3. plateau
    obs = "Aggregate tok/s plateaus as concurrency rises"
    if len(s) == 0 or s["concurrency"].nunique() < 2:
        add(obs, "n/a", "fewer than 2 concurrency levels")
    else:
        kn = knee(s)
        hit = kn[kn["plateau"]]
        if len(hit):
            ev = "; ".join(f"{r['bucket']}: knee at c={int(r['knee_concurrency'])} of {int(r['top_concurrency'])}, "
                           f"at most {r['max_gain_after_knee']:+.0%} per doubling after it" for _, r in hit.iterrows())
            add(obs, "yes", ev)
        else:
            sat = saturation(s)
            last = sat.groupby("bucket", sort=False).tail(1)
            ev = "; ".join(f"{r['bucket']}: still {r['gain_per_doubling']:+.0%} per doubling at "
                           f"c={int(r['concurrency'])}" for _, r in last.iterrows())
            add(obs, "no", ev)

    # 4. aggregate up while p95 spikes
    obs = "Aggregate improves while p95 latency spikes"
    if len(s) == 0 or s["concurrency"].nunique() < 2:
        add(obs, "n/a", "fewer than 2 concurrency levels")
    else:
        chk = slo_check(s, slo) if slo is not None else s.assign(meets_slo=True, slo_fail_reason="")
        hits = []
        for b in _ordered(chk["bucket"]):
            g = chk[chk["bucket"] == b].sort_values("concurrency")
            for (_, p), (_, q) in zip(g.iterrows(), g.iloc[1:].iterrows()):
                if not _num(q["aggregate_output_tps"]) > _num(p["aggregate_output_tps"]):
                    continue
                for col, name in (("e2e_p95_s", "E2E p95"), ("ttft_p95_s", "TTFT p95")):
                    a, z = _num(p[col]), _num(q[col])
                    if a > 0 and z / a > SPIKE_FACTOR:
                        txt = (f"{b}: c={int(p['concurrency'])}->{int(q['concurrency'])} aggregate "
                               f"{_pct_change(q['aggregate_output_tps'], p['aggregate_output_tps']):+.0f}%, "
                               f"{name} {a:.3f} -> {z:.3f} s ({z / a:.1f}x)")
                        if slo is not None and q["meets_slo"]:
                            txt += "; still meets the SLO"
                        elif slo is not None:
                            txt += f"; breaks the SLO ({q['slo_fail_reason']})"
                        hits.append(txt)
                        break
        add(obs, "yes" if hits else "no",
            "; ".join(hits) if hits else f"no adjacent levels where p95 E2E or TTFT grew > {SPIKE_FACTOR:.0f}x "
                                          "while aggregate tok/s rose")

    # 5. KV eviction
    obs = "Long prompts evict useful active requests"
    v = kv_verdict(samples) if samples is not None else None
    if v is None or not v["assessed"]:
        add(obs, "n/a", v["sentence"] if v else "no server metrics")
    else:
        add(obs, "yes" if v["limited"] else "no", v["sentence"])
    return pd.DataFrame(rows, columns=["observation", "present", "evidence", "first_check"])
