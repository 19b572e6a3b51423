"""Saturation: throughput and latency against concurrency, where throughput stops growing
(the knee), and goodput, the highest load level that meets the study's SLO."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from ..schema import Slo
from .stats import to_float, ordered_unique

KNEE_GAIN_PER_DOUBLING = 0.10


def slo_check(summary: pd.DataFrame, slo: Any) -> pd.DataFrame:
    """Every level against the SLO: ``meets_slo`` and ``slo_fail_reason`` columns added.

    ``slo`` is a mapping or object with ``ttft_p95_s``, ``tpot_p95_s`` (None = not
    constrained) and ``error_rate`` (highest acceptable failed fraction, default 0.01;
    None = not constrained). A level with no successful request fails every latency target.
    """
    s = summary.copy()
    slo = Slo.model_validate(slo) if isinstance(slo, dict) else (slo or Slo())
    err_lim = slo.error_rate
    # (column, limit, name, how a value is written)
    latency = [(col, lim, name, fmt) for col, lim, name, fmt in (
        ("ttft_p95_s", slo.ttft_p95_s, "TTFT p95", lambda x: f"{x:.3f} s"),
        ("tpot_p95_s", slo.tpot_p95_s, "TPOT p95", lambda x: f"{x * 1000:.1f} ms")) if lim is not None]
    meets, reasons = [], []
    for _, r in s.iterrows():
        why = []
        for col, lim, name, fmt in latency:
            v = to_float(r.get(col))
            if not math.isfinite(v):
                why.append(f"{name} unknown (no successful request)")
            elif v > lim:
                why.append(f"{name} {fmt(v)} > {fmt(lim)}")
        if err_lim is not None:
            sr = to_float(r.get("success_rate"))
            err = 1.0 - sr if math.isfinite(sr) else 1.0
            if err > err_lim + 1e-12:
                why.append(f"error rate {err:.1%} > {err_lim:.1%}")
        meets.append(not why)
        reasons.append("; ".join(why))
    s["meets_slo"] = meets
    s["slo_fail_reason"] = reasons
    return s


def saturation(summary: pd.DataFrame, slo: Any = None) -> pd.DataFrame:
    """Throughput and latency against concurrency, one row per level, sorted by
    configuration, bucket and concurrency.

    Columns: config, bucket, concurrency, aggregate_output_tps, decode_tps_p50,
    ttft_p50_s, ttft_p95_s, e2e_p95_s, tpot_p95_s, success_rate, ``gain_per_doubling``
    (aggregate throughput growth from the previous level, normalised to one doubling of
    concurrency: ``(agg_i / agg_{i-1}) ** (1 / log2(c_i / c_{i-1})) - 1``; NaN on the first
    level), ``knee`` (True on the row :func:`knee` picks) and, when ``slo`` is given,
    ``meets_slo``/``slo_fail_reason`` from :func:`slo_check`.
    """
    cols = ["config", "bucket", "concurrency", "aggregate_output_tps", "decode_tps_p50", "ttft_p50_s",
            "ttft_p95_s", "e2e_p95_s", "tpot_p95_s", "success_rate"]
    if summary is None or summary.empty:
        return pd.DataFrame(columns=cols + ["gain_per_doubling", "knee"])
    s = slo_check(summary, slo) if slo is not None else summary
    keep = cols + (["meets_slo", "slo_fail_reason"] if slo is not None else [])
    parts = []
    for cfg in ordered_unique(s["config"]):
        for b in ordered_unique(s.loc[s["config"] == cfg, "bucket"]):
            g = s[(s["config"] == cfg) & (s["bucket"] == b)].sort_values("concurrency")
            g = g[[c for c in keep if c in g.columns]].copy()
            c = g["concurrency"].to_numpy(dtype=float)
            agg = g["aggregate_output_tps"].to_numpy(dtype=float)
            gain = [math.nan]
            for i in range(1, len(g)):
                doublings = math.log2(c[i] / c[i - 1]) if c[i - 1] > 0 else math.nan
                if agg[i - 1] > 0 and doublings > 0 and math.isfinite(agg[i]):
                    gain.append((agg[i] / agg[i - 1]) ** (1.0 / doublings) - 1.0)
                else:
                    gain.append(math.nan)
            g["gain_per_doubling"] = gain
            k = _knee_index(c, np.asarray(gain), KNEE_GAIN_PER_DOUBLING)
            g["knee"] = [i == k for i in range(len(g))]
            parts.append(g)
    return pd.concat(parts, ignore_index=True)


def _knee_index(conc: np.ndarray, gain: np.ndarray, threshold: float) -> int | None:
    """Index i < last such that every step after level i gains < threshold per doubling."""
    n = len(conc)
    for i in range(n - 1):
        after = gain[i + 1:]
        if len(after) and all(math.isfinite(g) and g < threshold for g in after):
            return i
    return None


def knee(summary_or_saturation: pd.DataFrame, threshold: float = KNEE_GAIN_PER_DOUBLING) -> pd.DataFrame:
    """Where aggregate throughput stops growing, per configuration x bucket.

    Rule: walk the levels by increasing concurrency; the knee is the *lowest*
    concurrency after which *every* further step gains less than ``threshold`` (10 %)
    per doubling of concurrency (gain as in :func:`saturation`). A single late step above
    the threshold therefore moves the knee up; a step with unknown gain (a level without
    throughput) blocks it. When even the last step gains >= 10 % there is no knee: the
    server is not saturated within the tested range.

    Columns: config, bucket, knee_concurrency (NaN if none), top_concurrency, plateau
    (knee found below the top level), max_gain_after_knee, reason.
    """
    sat = summary_or_saturation
    if "gain_per_doubling" not in sat.columns:
        sat = saturation(sat)
    rows = []
    for cfg in ordered_unique(sat["config"]):
        for b in ordered_unique(sat.loc[sat["config"] == cfg, "bucket"]):
            g = sat[(sat["config"] == cfg) & (sat["bucket"] == b)].sort_values("concurrency")
            conc = g["concurrency"].to_numpy(dtype=float)
            gain = g["gain_per_doubling"].to_numpy(dtype=float)
            top = int(conc[-1])
            if len(g) < 2:
                rows.append({"config": cfg, "bucket": b, "knee_concurrency": math.nan, "top_concurrency": top,
                             "plateau": False, "max_gain_after_knee": math.nan,
                             "reason": "one concurrency level only: no curve to find a knee on"})
                continue
            i = _knee_index(conc, gain, threshold)
            steps = ", ".join(f"c={int(conc[j - 1])}->{int(conc[j])} {gain[j]:+.0%}" for j in range(1, len(g)))
            if i is None:
                rows.append({"config": cfg, "bucket": b, "knee_concurrency": math.nan, "top_concurrency": top,
                             "plateau": False, "max_gain_after_knee": math.nan,
                             "reason": f"no knee: the last step still gains >= {threshold:.0%} per doubling or is "
                                       f"unknown ({steps}); not saturated within the tested range"})
            else:
                after = gain[i + 1:]
                rows.append({"config": cfg, "bucket": b, "knee_concurrency": int(conc[i]), "top_concurrency": top,
                             "plateau": True, "max_gain_after_knee": float(np.max(after)),
                             "reason": f"after c={int(conc[i])} every step gains < {threshold:.0%} per doubling "
                                       f"({steps})"})
    return pd.DataFrame(rows, columns=["config", "bucket", "knee_concurrency", "top_concurrency", "plateau",
                                       "max_gain_after_knee", "reason"])


def goodput(summary: pd.DataFrame, slo: Any) -> pd.DataFrame:
    """SLO-bound throughput ("goodput"): per configuration x bucket, the highest
    concurrency whose p95 TTFT, p95 TPOT and error rate all meet ``slo`` (see
    :func:`slo_check`), its aggregate and per-request decode tok/s, and for every level
    that fails, why (``failing``: "c=32: TTFT p95 1.204 s > 1.000 s; ..."). ``note`` flags
    a failing level *below* the goodput level (a non-monotonic curve: treat with care).
    """
    chk = slo_check(summary, slo)
    rows = []
    for cfg in ordered_unique(chk["config"]):
        for b in ordered_unique(chk.loc[chk["config"] == cfg, "bucket"]):
            g = chk[(chk["config"] == cfg) & (chk["bucket"] == b)].sort_values("concurrency")
            ok = g[g["meets_slo"]]
            bad = g[~g["meets_slo"]]
            failing = "; ".join(f"c={int(r['concurrency'])}: {r['slo_fail_reason']}" for _, r in bad.iterrows())
            if ok.empty:
                rows.append({"config": cfg, "bucket": b, "goodput_concurrency": math.nan,
                             "aggregate_output_tps": math.nan, "decode_tps_p50": math.nan,
                             "levels_meeting": "", "failing": failing,
                             "note": "no level meets the SLO"})
                continue
            best = ok.iloc[-1]
            below = bad[bad["concurrency"] < best["concurrency"]]
            rows.append({
                "config": cfg, "bucket": b, "goodput_concurrency": int(best["concurrency"]),
                "aggregate_output_tps": float(best["aggregate_output_tps"]),
                "decode_tps_p50": float(best["decode_tps_p50"]),
                "levels_meeting": ", ".join(str(int(c)) for c in ok["concurrency"]),
                "failing": failing,
                "note": (f"level(s) c={', '.join(str(int(c)) for c in below['concurrency'])} below the goodput "
                         "level fail: the curve is not monotonic (noise or a transient)") if len(below) else "",
            })
    return pd.DataFrame(rows, columns=["config", "bucket", "goodput_concurrency", "aggregate_output_tps",
                                       "decode_tps_p50", "levels_meeting", "failing", "note"])
