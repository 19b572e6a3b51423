"""The symptom table "observation -> first check", filled from one configuration's data: one
function per rule, each returning a `Finding` (rule id, verdict, evidence as `Phrase`s with
the numbers). Not for wording: the observations, first checks and evidence sentences are in
report/i18n (`symptom.<rule>.*`, `finding.*`), said by `servelab.report.diagnosis`."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NamedTuple

import pandas as pd

from ..summary import LEVEL_KEYS
from .kv import kv_verdict
from .phrase import Clauses, Phrase, clauses
from .prefill import fit_prefill
from .saturation import knee, saturation, slo_check
from .stats import ordered_unique, pct_change, to_float

#: the table's rows, in order; the report words each as `symptom.<rule>.observation`/`.first_check`
RULES = ("ttft_grows_with_prompt", "slow_decode_at_c1", "throughput_plateau", "latency_spike", "kv_eviction")

SPIKE_FACTOR = 2.0  # p95 latency growth between adjacent levels that counts as a spike

SLOW_DECODE_FRAC = 0.5  # c=1 decode below this fraction of the roofline bound is "slow"

PROMPT_TTFT_FACTOR = 2.0  # TTFT at the longest prompt over the shortest


class Finding(NamedTuple):
    """One rule's verdict: `present` is "yes", "no" or "n/a" (the data cannot tell); `evidence`
    is what the numbers show (a `Phrase`, `Clauses` or `Sentences`)."""

    rule: str
    present: str
    evidence: Any


def _pick_fit(fit: Any, config: str) -> Mapping[str, Any] | None:
    if not fit:
        return None
    if isinstance(fit, Mapping) and "prefill_tps" in fit:
        return fit
    if isinstance(fit, Mapping):
        return fit.get(config)
    return None


def ttft_grows_with_prompt(s: pd.DataFrame, fit: Mapping[str, Any] | None) -> Finding:
    """At concurrency 1, median TTFT at the longest prompt > 2x that at the shortest, and (when
    the fit has errors) the fitted slope's 95 % interval is above 0; n/a with fewer than 2
    prompt lengths."""
    rule = "ttft_grows_with_prompt"
    f = fit
    if not f or f.get("distinct_prompt_lengths", 0) < 2 or not math.isfinite(
            to_float(f.get("ttft_longest_over_shortest"))):
        return Finding(rule, "n/a", Phrase("too_few_prompt_lengths"))
    ratio = float(f["ttft_longest_over_shortest"])
    has_se = math.isfinite(to_float(f.get("slope_se")))
    sig = bool(f.get("slope_significant")) if has_se else True
    ev = [Phrase("ttft_prompt.ratio", {"ttft_shortest_ms": f["ttft_shortest_s"] * 1000,
                                       "prompt_tokens_shortest": f["prompt_tokens_shortest"],
                                       "ttft_longest_ms": f["ttft_longest_s"] * 1000,
                                       "prompt_tokens_longest": f["prompt_tokens_longest"], "ratio": ratio})]
    if math.isfinite(to_float(f.get("prefill_tps"))):
        fitted = {"prefill_tps": f["prefill_tps"], "overhead_ms": f["overhead_s"] * 1000, "r2": f["r2"], "n": f["n"]}
        if math.isfinite(to_float(f.get("prefill_tps_se"))):
            ev.append(Phrase("ttft_prompt.fit_with_se", {**fitted, "prefill_tps_se": f["prefill_tps_se"]}))
        else:
            ev.append(Phrase("ttft_prompt.fit", fitted))
    elif math.isfinite(to_float(f.get("slope_s_per_token"))) and float(f["slope_s_per_token"]) <= 0:
        ev.append(Phrase("ttft_prompt.no_slope"))
    elif f.get("note"):
        ev.append(Phrase("note", {"note": f["note"]}))
    if has_se and not sig:
        ev.append(Phrase("ttft_prompt.slope_not_significant"))
    return Finding(rule, "yes" if ratio > PROMPT_TTFT_FACTOR and sig else "no", Clauses(ev))


def slow_decode_at_c1(s: pd.DataFrame, bound_s_per_token: float | Mapping[str, float] | None) -> Finding:
    """Per-request decode tok/s (p50) at concurrency 1 < 50 % of the roofline bound
    ``1 / bound_s_per_token`` (a number, or a dict per bucket, from
    :func:`servelab.analysis.roofline.roofline_efficiency`); n/a without a bound or without c=1."""
    rule = "slow_decode_at_c1"
    c1 = s[s["concurrency"] == 1] if len(s) else s
    if bound_s_per_token is None:
        return Finding(rule, "n/a", Phrase("slow_decode.no_bound_given"))
    if c1.empty:
        return Finding(rule, "n/a", Phrase("slow_decode.no_c1"))
    levels, slow = [], False
    for _, r in c1.iterrows():
        bound = bound_s_per_token.get(r["bucket"]) if isinstance(bound_s_per_token, Mapping) else bound_s_per_token
        if bound is None or not bound > 0:
            continue
        bound_tps = 1.0 / float(bound)
        meas = to_float(r["decode_tps_p50"])
        slow = slow or meas / bound_tps < SLOW_DECODE_FRAC
        levels.append(Phrase("slow_decode.level", {"bucket": r["bucket"], "decode_tps": meas, "bound_tps": bound_tps,
                                                   "frac": meas / bound_tps}))
    if not levels:
        return Finding(rule, "n/a", Phrase("slow_decode.no_bound_for_buckets"))
    return Finding(rule, "yes" if slow else "no",
                   Phrase("slow_decode.levels", {"levels": Clauses(levels), "slow_frac": SLOW_DECODE_FRAC}))


def throughput_plateau(s: pd.DataFrame) -> Finding:
    """:func:`knee` finds a knee below the top level in some bucket; n/a with a single concurrency."""
    rule = "throughput_plateau"
    if len(s) == 0 or s["concurrency"].nunique() < 2:
        return Finding(rule, "n/a", Phrase("too_few_concurrencies"))
    kn = knee(s)
    hit = kn[kn["plateau"]]
    if len(hit):
        return Finding(rule, "yes", Clauses(
            Phrase("plateau.knee", {"bucket": r["bucket"], "knee": int(r["knee_concurrency"]),
                                    "top": int(r["top_concurrency"]), "max_gain": r["max_gain_after_knee"]})
            for _, r in hit.iterrows()))
    last = saturation(s).groupby("bucket", sort=False).tail(1)
    last = last[pd.to_numeric(last["gain_per_doubling"], errors="coerce").notna()]  # a bucket at one concurrency has no gain
    if not len(last):
        return Finding(rule, "n/a", Phrase("too_few_concurrencies"))
    return Finding(rule, "no", Clauses(
        Phrase("plateau.still_growing", {"bucket": r["bucket"], "gain": r["gain_per_doubling"],
                                         "concurrency": int(r["concurrency"])}) for _, r in last.iterrows()))


def _spike(b: str, p: pd.Series, q: pd.Series, slo: Any) -> Clauses | None:
    """The first p95 latency (E2E, then TTFT) that grew > SPIKE_FACTOR from level p to q."""
    for col, metric in (("e2e_p95_s", "E2E p95"), ("ttft_p95_s", "TTFT p95")):
        a, z = to_float(p[col]), to_float(q[col])
        if a > 0 and z / a > SPIKE_FACTOR:
            hit = Phrase("spike.level", {"bucket": b, "c_from": int(p["concurrency"]), "c_to": int(q["concurrency"]),
                                         "aggregate_change_pct": pct_change(q["aggregate_output_tps"],
                                                                            p["aggregate_output_tps"]),
                                         "metric": metric, "before_s": a, "after_s": z, "factor": z / a})
            if slo is None:
                return clauses(hit)
            if q["meets_slo"]:
                return clauses(hit, Phrase("spike.meets_slo"))
            return clauses(hit, Phrase("spike.breaks_slo", {"reason": q["slo_fail_reason"]}))
    return None


def latency_spike(s: pd.DataFrame, slo: Any) -> Finding:
    """Between adjacent levels aggregate tok/s grows while p95 E2E or p95 TTFT grows > 2x
    (``slo``, if given, says whether the spiking level still meets it)."""
    rule = "latency_spike"
    if len(s) == 0 or s["concurrency"].nunique() < 2:
        return Finding(rule, "n/a", Phrase("too_few_concurrencies"))
    chk = slo_check(s, slo) if slo is not None else s.assign(meets_slo=True, slo_fail_reason="")
    hits: list[Any] = []
    for b in ordered_unique(chk["bucket"]):
        g = chk[chk["bucket"] == b].sort_values("concurrency")
        for (_, p), (_, q) in zip(g.iterrows(), g.iloc[1:].iterrows()):
            if to_float(q["aggregate_output_tps"]) > to_float(p["aggregate_output_tps"]):
                hits.extend(_spike(b, p, q, slo) or ())
    if not hits:
        return Finding(rule, "no", Phrase("spike.none", {"factor": SPIKE_FACTOR}))
    return Finding(rule, "yes", Clauses(hits))


def kv_eviction(samples: pd.DataFrame | None) -> Finding:
    """:func:`kv_verdict` is limited (preemptions, or requests waiting while KV usage >= 90 %);
    n/a without /metrics."""
    rule = "kv_eviction"
    v = kv_verdict(samples) if samples is not None else None
    if v is None:
        return Finding(rule, "n/a", Phrase("no_server_metrics"))
    if not v["assessed"]:
        return Finding(rule, "n/a", v["evidence"])
    return Finding(rule, "yes" if v["limited"] else "no", v["evidence"])


def symptoms(summary: pd.DataFrame, samples: pd.DataFrame | None, fit: Any = None, slo: Any = None,
             decode_bound_s_per_token: float | Mapping[str, float] | None = None,
             config: str | None = None) -> pd.DataFrame:
    """The symptom table for one configuration, filled from this run: one row per rule of
    `RULES` (columns rule | present | evidence, see `Finding`).

    ``fit`` is :func:`fit_prefill`'s output (or one of its dicts), computed from ``summary`` when
    None; ``decode_bound_s_per_token`` the roofline bound (a number or a dict per bucket);
    ``slo`` the study's SLO; ``config`` selects the configuration when ``summary`` holds several.
    """
    cfgs = ordered_unique(summary["config"]) if summary is not None and not summary.empty else []
    if config is None:
        if len(cfgs) > 1:
            raise ValueError(f"summary holds several configurations {cfgs}; pass config=")
        config = cfgs[0] if cfgs else None
    s = summary[summary["config"] == config] if config is not None else pd.DataFrame(columns=LEVEL_KEYS)
    f = _pick_fit(fit, str(config)) if fit is not None else None
    if f is None and len(s):
        f = fit_prefill(s, concurrency=1).get(str(config))
    rows = [ttft_grows_with_prompt(s, f), slow_decode_at_c1(s, decode_bound_s_per_token), throughput_plateau(s),
            latency_spike(s, slo), kv_eviction(samples)]
    return pd.DataFrame(rows, columns=list(Finding._fields))
