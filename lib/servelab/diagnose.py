"""Diagnosis of a run: turn records, summaries and server metrics into findings with numbers.

What this module is for (stage 04_diagnose, seed 002 "diagnose prefill, decode, KV cache,
scheduling"; every function is a pure function of frames/dicts already on disk)
--------------------------------------------------------------------------------------
1. Prefill: :func:`fit_prefill` fits ``TTFT = overhead_s + prompt_tokens / prefill_tps``
   by least squares at concurrency 1 (:func:`fit_ttft` is the numpy core), with standard
   errors and 95 % confidence intervals from the regression.
2. Saturation: :func:`saturation` (throughput/latency against concurrency, gain per
   doubling), :func:`knee` (where throughput stops growing), :func:`slo_check` and
   :func:`goodput` (the highest load level that meets the SLO, and why the others fail).
3. KV residency: :func:`kv_bytes_per_token`, :func:`kv_capacity`, :func:`parse_size_bytes`,
   :func:`kv_capacity_check` (model facts against the server's own block count),
   :func:`kv_residency` (per-level pressure), :func:`kv_verdict` (does KV limit
   concurrency?) and the plot :func:`kv_timeseries`.
4. Roofline: re-exported from :mod:`servelab.hardware` (``roofline_efficiency`` and the
   bounds), which owns the hardware table.
5. Speculative decoding: :func:`spec_stats`, :func:`spec_ab`, :func:`derive_capture_sizes`
   and :func:`capture_size_warnings` (seed 001's pitfall: with MTP=1, 4 concurrent
   requests need a CUDA-graph capture size of 8).
6. One change at a time: :func:`config_diff` and :func:`compare_configs`.
7. Seed 002's symptom table: :func:`symptoms` (observation | present? | evidence | first check).

What it is not for
------------------
* Not for measuring (``runner``, ``metrics``), aggregating requests (``summary``) or
  writing prose (the report layer). It never talks to a server.
* It does not decide causes. Each finding says what the numbers show and which check
  seed 002 says to make first; the report author draws the conclusion.
* Plots: only :func:`kv_timeseries` draws (a matplotlib Figure, Agg backend); the
  throughput/latency curves live in :mod:`servelab.plots`.

Units are in the names: ``_s`` seconds, ``_tps`` tokens per second, ``_bytes`` bytes,
``_frac`` 0..1 fractions, ``_pct`` percent.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import matplotlib


import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from .hardware import (  # noqa: E402,F401  (re-exported: the roofline belongs to diagnosis too)
    decode_bound_s_per_token,
    decode_weight_bytes,
    prefill_bound_s,
    roofline_efficiency,
)

__all__ = [
    "fit_ttft",
    "fit_prefill",
    "saturation",
    "knee",
    "slo_check",
    "goodput",
    "KV_DTYPE_BYTES",
    "kv_bytes_per_token",
    "kv_capacity",
    "parse_size_bytes",
    "kv_capacity_check",
    "kv_residency",
    "kv_verdict",
    "kv_timeseries",
    "spec_stats",
    "spec_ab",
    "derive_capture_sizes",
    "capture_size_warnings",
    "config_diff",
    "compare_configs",
    "symptoms",
    "SYMPTOM_FIRST_CHECKS",
    "KNEE_GAIN_PER_DOUBLING",
    "decode_bound_s_per_token",
    "prefill_bound_s",
    "roofline_efficiency",
]

LEVEL_KEYS = ["config", "bucket", "target_input_tokens", "target_output_tokens", "concurrency"]

# --------------------------------------------------------------------------- helpers


def _get(obj: Any, key: str, default: Any = None) -> Any:
    """``obj[key]`` for mappings, ``obj.key`` otherwise (pydantic Slo, dataclasses)."""
    if obj is None:
        return default
    if isinstance(obj, Mapping):
        return obj.get(key, default)
    return getattr(obj, key, default)


def _num(v: Any) -> float:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return math.nan
    return f


def _pct_change(new: float, old: float) -> float:
    new, old = _num(new), _num(old)
    if not (math.isfinite(new) and math.isfinite(old)) or old == 0:
        return math.nan
    return (new - old) / old * 100.0


def _ordered(values: Iterable[Any]) -> list[Any]:
    return list(dict.fromkeys(values))


# Two-sided 95 % Student t quantiles (t_{0.975, df}) for df = 1..30.
_T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
         2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
         2.052, 2.048, 2.045, 2.042]


def _t975(df: int) -> float:
    """t_{0.975} with ``df`` degrees of freedom: scipy when installed, else a table
    (df <= 30) or the Cornish-Fisher expansion (error < 1e-4 beyond 30)."""
    if df < 1:
        return math.nan
    try:
        from scipy.stats import t as _t  # optional

        return float(_t.ppf(0.975, df))
    except ImportError:
        pass
    if df <= 30:
        return _T975[df - 1]
    z = 1.959963984540054
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


# --------------------------------------------------------------------------- 1. prefill


def fit_ttft(prompt_tokens: Sequence[float] | np.ndarray, ttft_s: Sequence[float] | np.ndarray) -> dict[str, Any]:
    """Ordinary least squares of ``ttft_s = overhead_s + slope_s_per_token * prompt_tokens``.

    ``prefill_tps = 1 / slope``. Standard errors are the usual OLS ones
    (``s^2 = RSS / (n - 2)``; ``se(slope) = s / sqrt(Sxx)``;
    ``se(overhead) = s * sqrt(1/n + mean(x)^2 / Sxx)``); ``prefill_tps_se`` uses the
    delta method (``se(slope) / slope^2``) and ``prefill_tps_ci95`` inverts the slope's
    95 % interval (upper end ``inf`` when that interval reaches 0).
    ``slope_significant`` is True when the slope's 95 % interval lies above 0.
    With fewer than 2 distinct prompt lengths nothing is fitted (NaNs and a ``note``);
    with exactly 2 points the fit is exact and the errors are NaN.
    """
    x = np.asarray(prompt_tokens, dtype=float)
    y = np.asarray(ttft_s, dtype=float)
    keep = np.isfinite(x) & np.isfinite(y)
    x, y = x[keep], y[keep]
    n = int(len(x))
    distinct = int(len(np.unique(x)))
    nan2 = (math.nan, math.nan)
    out: dict[str, Any] = {
        "method": "OLS: ttft_s = overhead_s + prompt_tokens / prefill_tps",
        "prefill_tps": math.nan, "prefill_tps_se": math.nan, "prefill_tps_ci95": nan2,
        "overhead_s": math.nan, "overhead_s_se": math.nan, "overhead_s_ci95": nan2,
        "slope_s_per_token": math.nan, "slope_se": math.nan, "slope_significant": False,
        "r2": math.nan, "n": n, "distinct_prompt_lengths": distinct, "note": "",
    }
    if distinct < 2:
        out["note"] = (f"fewer than 2 distinct prompt lengths ({distinct}): the prefill rate is not "
                       "identifiable; measure buckets with different input_tokens at concurrency 1")
        return out
    xm, ym = float(x.mean()), float(y.mean())
    sxx = float(((x - xm) ** 2).sum())
    b = float(((x - xm) * (y - ym)).sum() / sxx)
    a = ym - b * xm
    resid = y - (a + b * x)
    rss = float((resid**2).sum())
    tss = float(((y - ym) ** 2).sum())
    dof = n - 2
    notes = []
    if dof > 0:
        s2 = rss / dof
        se_b = math.sqrt(s2 / sxx)
        se_a = math.sqrt(s2 * (1.0 / n + xm**2 / sxx))
        t = _t975(dof)
    else:
        se_b = se_a = t = math.nan
        notes.append("only 2 points: exact fit, no standard errors")
    out.update(
        slope_s_per_token=b, slope_se=se_b, overhead_s=a, overhead_s_se=se_a,
        overhead_s_ci95=(a - t * se_a, a + t * se_a),
        r2=(1.0 - rss / tss) if tss > 0 else math.nan,
    )
    if math.isfinite(se_b):
        out["slope_significant"] = bool(b - t * se_b > 0)
    if b > 0:
        out["prefill_tps"] = 1.0 / b
        out["prefill_tps_se"] = se_b / b**2
        lo_b, hi_b = b - t * se_b, b + t * se_b
        out["prefill_tps_ci95"] = (1.0 / hi_b if math.isfinite(hi_b) else math.nan,
                                   (1.0 / lo_b if lo_b > 0 else math.inf) if math.isfinite(lo_b) else math.nan)
    else:
        notes.append("TTFT does not grow with prompt length (slope <= 0): prefill is hidden by other "
                     "costs (queueing, HTTP, first decode step) or the prompts are too short")
    out["note"] = "; ".join(notes)
    return out


def fit_prefill(data: pd.DataFrame, concurrency: int = 1) -> dict[str, dict[str, Any]]:
    """TTFT against prompt length per configuration: ``{config: fit}``.

    ``data`` is either a records frame (``load_records``: one point per successful,
    measured, non-warmup request at ``concurrency``; buckets with ``shared_prefix`` are
    left out because prefix-cache hits shorten their prefill) or a summary frame
    (``summarize``: one point per level, its median prompt tokens and ``ttft_p50_s``).
    Each fit is :func:`fit_ttft`'s dict plus ``config``, ``concurrency``, ``source``
    ("records"/"summary"), and the medians at the shortest and longest prompt
    (``prompt_tokens_shortest``, ``ttft_shortest_s``, ``prompt_tokens_longest``,
    ``ttft_longest_s``, ``ttft_longest_over_shortest``).
    """
    if data is None or data.empty:
        return {}
    is_records = "ttft_s" in data.columns
    out: dict[str, dict[str, Any]] = {}
    for cfg in _ordered(data["config"]):
        d = data[(data["config"] == cfg) & (data["concurrency"] == concurrency)]
        if is_records:
            d = d[d["ok"].astype(bool) & ~d["warmup"].astype(bool)]
            if "shared_prefix" in d.columns:
                d = d[~d["shared_prefix"].fillna(False).astype(bool)]
            x, y = d["prompt_tokens"], d["ttft_s"]
            gkey = "target_input_tokens" if "target_input_tokens" in d.columns else "prompt_tokens"
            per_len = d.groupby(gkey).agg(p=("prompt_tokens", "median"), t=("ttft_s", "median"))
        else:
            x, y = d["prompt_tokens"], d["ttft_p50_s"]
            per_len = pd.DataFrame({"p": d["prompt_tokens"].to_numpy(), "t": d["ttft_p50_s"].to_numpy()})
        fit = fit_ttft(x.to_numpy(dtype=float), y.to_numpy(dtype=float))
        per_len = per_len.dropna().sort_values("p")
        extra: dict[str, Any] = {"prompt_tokens_shortest": math.nan, "ttft_shortest_s": math.nan,
                                 "prompt_tokens_longest": math.nan, "ttft_longest_s": math.nan,
                                 "ttft_longest_over_shortest": math.nan}
        if len(per_len):
            lo, hi = per_len.iloc[0], per_len.iloc[-1]
            extra.update(prompt_tokens_shortest=float(lo["p"]), ttft_shortest_s=float(lo["t"]),
                         prompt_tokens_longest=float(hi["p"]), ttft_longest_s=float(hi["t"]),
                         ttft_longest_over_shortest=float(hi["t"] / lo["t"]) if lo["t"] > 0 else math.nan)
        if fit["n"] == 0:
            fit["note"] = f"no successful measured requests at concurrency {concurrency}"
        out[str(cfg)] = {"config": str(cfg), "concurrency": concurrency,
                         "source": "records" if is_records else "summary", **fit, **extra}
    return out


# --------------------------------------------------------------------------- 2. saturation

KNEE_GAIN_PER_DOUBLING = 0.10


def slo_check(summary: pd.DataFrame, slo: Any) -> pd.DataFrame:
    """Every level against the SLO: ``meets_slo`` and ``slo_fail_reason`` columns added.

    ``slo`` is a mapping or object with ``ttft_p95_s``, ``tpot_p95_s`` (None = not
    constrained) and ``error_rate`` (highest acceptable failed fraction, default 0.01;
    None = not constrained). A level with no successful request fails every latency target.
    """
    s = summary.copy()
    ttft_lim = _get(slo, "ttft_p95_s")
    tpot_lim = _get(slo, "tpot_p95_s")
    err_lim = _get(slo, "error_rate", 0.01)
    meets, reasons = [], []
    for _, r in s.iterrows():
        why = []
        if ttft_lim is not None:
            v = _num(r.get("ttft_p95_s"))
            if not math.isfinite(v):
                why.append("TTFT p95 unknown (no successful request)")
            elif v > ttft_lim:
                why.append(f"TTFT p95 {v:.3f} s > {ttft_lim:.3f} s")
        if tpot_lim is not None:
            v = _num(r.get("tpot_p95_s"))
            if not math.isfinite(v):
                why.append("TPOT p95 unknown (no successful request)")
            elif v > tpot_lim:
                why.append(f"TPOT p95 {v * 1000:.1f} ms > {tpot_lim * 1000:.1f} ms")
        if err_lim is not None:
            sr = _num(r.get("success_rate"))
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
    for cfg in _ordered(s["config"]):
        for b in _ordered(s.loc[s["config"] == cfg, "bucket"]):
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
    for cfg in _ordered(sat["config"]):
        for b in _ordered(sat.loc[sat["config"] == cfg, "bucket"]):
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
    """SLO-bound throughput (design.md "goodput"): per configuration x bucket, the highest
    concurrency whose p95 TTFT, p95 TPOT and error rate all meet ``slo`` (see
    :func:`slo_check`), its aggregate and per-request decode tok/s, and for every level
    that fails, why (``failing``: "c=32: TTFT p95 1.204 s > 1.000 s; ..."). ``note`` flags
    a failing level *below* the goodput level (a non-monotonic curve: treat with care).
    """
    chk = slo_check(summary, slo)
    rows = []
    for cfg in _ordered(chk["config"]):
        for b in _ordered(chk.loc[chk["config"] == cfg, "bucket"]):
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


# --------------------------------------------------------------------------- 3. KV cache

# Bytes per element of a KV-cache dtype (vLLM --kv-cache-dtype values and torch names).
KV_DTYPE_BYTES: dict[str, int] = {
    "float32": 4, "fp32": 4, "float": 4,
    "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "half": 2,
    "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "fp8_inc": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
}


def _model_dtype_bytes(cfg: Mapping[str, Any]) -> int:
    dt = str(cfg.get("dtype") or cfg.get("torch_dtype") or "bfloat16").lower().replace("torch.", "")
    if dt not in KV_DTYPE_BYTES:
        raise ValueError(f"unknown model dtype {dt!r}; known: {sorted(KV_DTYPE_BYTES)}")
    return KV_DTYPE_BYTES[dt]


def kv_bytes_per_token(facts_or_config: Mapping[str, Any], kv_dtype: str = "auto",
                       tensor_parallel_size: int = 1) -> int:
    """KV-cache bytes one token occupies, over all layers (per GPU when
    ``tensor_parallel_size`` > 1).

    * MHA/GQA: ``layers * 2 (K and V) * kv_heads * head_dim * dtype_bytes``; with tensor
      parallelism each rank holds ``max(1, kv_heads // tp)`` heads (KV heads are
      replicated when there are fewer than ranks).
    * MLA (DeepSeek V2/V3, recognised by ``kv_lora_rank``): one compressed latent plus the
      decoupled rope key per layer, ``layers * (kv_lora_rank + qk_rope_head_dim) *
      dtype_bytes`` -- no factor 2, and replicated on every TP rank (as vLLM and SGLang
      store it).

    ``facts_or_config`` is :func:`servelab.modelmake.model_facts` output (``num_layers``,
    ``num_kv_heads``, ``head_dim``, ``dtype``) or an HF ``config.json`` dict
    (``num_hidden_layers``, ``num_key_value_heads``, ``head_dim`` or hidden/heads,
    ``torch_dtype``). ``kv_dtype`` "auto" means the model dtype (vLLM's default), "fp8*"
    one byte. E.g. Llama-3.1-8B bf16: 32 * 2 * 8 * 128 * 2 = 131072.
    """
    c = facts_or_config
    layers = int(c.get("num_layers") or c["num_hidden_layers"])
    if kv_dtype in (None, "auto"):
        nbytes = _model_dtype_bytes(c)
    else:
        key = str(kv_dtype).lower()
        if key not in KV_DTYPE_BYTES:
            raise ValueError(f"unknown kv_dtype {kv_dtype!r}; known: auto, {', '.join(sorted(KV_DTYPE_BYTES))}")
        nbytes = KV_DTYPE_BYTES[key]
    if c.get("kv_lora_rank"):
        return layers * (int(c["kv_lora_rank"]) + int(c["qk_rope_head_dim"])) * nbytes
    heads = int(c.get("num_heads") or c.get("num_attention_heads"))
    kv_heads = int(c.get("num_kv_heads") or c.get("num_key_value_heads") or heads)
    head_dim = int(c.get("head_dim") or int(c["hidden_size"]) // heads)
    tp = max(1, int(tensor_parallel_size))
    per_rank_heads = max(1, kv_heads // tp)
    return layers * 2 * per_rank_heads * head_dim * nbytes


def kv_capacity(free_bytes: float, bytes_per_token: float, block_size: int | None = None) -> int:
    """Tokens of KV cache that fit in ``free_bytes``: ``floor(free / bytes_per_token)``,
    or, with ``block_size``, whole blocks only (``floor(free / (bytes_per_token *
    block_size)) * block_size``, vLLM's paged allocation)."""
    if bytes_per_token <= 0:
        raise ValueError("bytes_per_token must be > 0")
    if block_size:
        return int(free_bytes // (bytes_per_token * block_size)) * int(block_size)
    return int(free_bytes // bytes_per_token)


_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)\s*([A-Za-z]*)\s*$")
_SIZE_UNITS = {
    "": 1, "b": 1,
    # vLLM's human_readable_int (vllm/utils/argparse_utils.py): lower case = decimal,
    # upper case = binary ("256M" = 256 * 2**20).
    "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
    "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40,
    # explicit units, any case: IEC binary and SI decimal
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
}


def parse_size_bytes(value: Any) -> int:
    """Bytes from a size such as ``"256M"``, ``"1G"``, ``"2GiB"``, ``"1.5GB"``, ``1024``.

    Single-letter suffixes follow vLLM's ``--kv-cache-memory-bytes`` parser: upper case is
    binary (``"256M"`` = 268435456), lower case decimal (``"256m"`` = 256000000).
    ``KiB/MiB/GiB/TiB`` are binary and ``KB/MB/GB/TB`` decimal in any case.
    Raises ValueError otherwise.
    """
    if isinstance(value, bool):
        raise ValueError(f"not a size: {value!r}")
    if isinstance(value, (int, float, np.integer, np.floating)):
        return int(value)
    m = _SIZE_RE.match(str(value))
    if not m:
        raise ValueError(f"not a size: {value!r}")
    num, unit = float(m.group(1)), m.group(2)
    if unit in _SIZE_UNITS:
        mult = _SIZE_UNITS[unit]
    elif len(unit) > 1 and unit.lower() in _SIZE_UNITS:
        mult = _SIZE_UNITS[unit.lower()]
    else:
        raise ValueError(f"unknown size unit {unit!r} in {value!r}")
    return int(round(num * mult))


def _arg(args: Mapping[str, Any] | None, name: str) -> Any:
    """A CLI flag from an engine ``args`` dict, spelled with dashes or underscores."""
    if not args:
        return None
    for k in (name, name.replace("-", "_"), name.replace("_", "-")):
        if k in args:
            return args[k]
    return None


def _engine_args(engine: Mapping[str, Any] | None) -> dict[str, Any]:
    """The flags dict from run.json ``engine_params`` (or an ``args`` dict itself)."""
    if not engine:
        return {}
    if isinstance(engine.get("args"), Mapping):
        return dict(engine["args"])
    return dict(engine)


def _json_value(v: Any) -> Any:
    if isinstance(v, str) and v.strip()[:1] in ("{", "["):
        try:
            return json.loads(v)
        except json.JSONDecodeError:
            return v
    return v


def kv_capacity_check(facts: Mapping[str, Any], kv_memory_bytes: Any, server_capacity_tokens: float | None,
                      block_size: int | None = None, kv_dtype: str = "auto",
                      tensor_parallel_size: int = 1) -> dict[str, Any]:
    """Model-facts prediction of KV capacity (tokens) against the server's own figure.

    ``predicted_capacity_tokens = kv_capacity(kv_memory_bytes, kv_bytes_per_token(...),
    block_size)`` where ``kv_memory_bytes`` is the per-GPU KV budget (e.g. vLLM's
    ``--kv-cache-memory-bytes``, parsed by :func:`parse_size_bytes`), compared with
    ``server_capacity_tokens`` (vLLM ``num_gpu_blocks x block_size``; SGLang
    ``max_total_num_tokens``). Returns both, ``diff_pct`` (server vs prediction) and a
    sentence.
    """
    mem = parse_size_bytes(kv_memory_bytes)
    bpt = kv_bytes_per_token(facts, kv_dtype, tensor_parallel_size)
    pred = kv_capacity(mem, bpt, block_size)
    server = _num(server_capacity_tokens)
    diff = _pct_change(server, pred)
    blocks = f" in blocks of {block_size}" if block_size else ""
    if math.isfinite(server):
        verdict = "agrees" if abs(diff) < 1.0 else "differs"
        sentence = (f"Model facts predict {pred:,} KV tokens ({mem:,} bytes / {bpt:,} bytes per token{blocks}); "
                    f"the server reports {int(server):,}: {verdict} ({diff:+.1f} %).")
    else:
        sentence = (f"Model facts predict {pred:,} KV tokens ({mem:,} bytes / {bpt:,} bytes per token{blocks}); "
                    "the server did not report its capacity.")
    return {"kv_memory_bytes": mem, "kv_bytes_per_token": bpt, "predicted_capacity_tokens": pred,
            "server_capacity_tokens": server, "diff_pct": diff, "sentence": sentence}


def _metrics_available(samples: pd.DataFrame | None) -> tuple[bool, str]:
    if samples is None:
        return False, "no server_metrics.jsonl"
    if samples.attrs.get("available") is False:
        return False, str(samples.attrs.get("reason") or "the server has no /metrics endpoint")
    if samples.empty:
        return False, "no samples"
    if "kv_usage_frac" not in samples.columns or samples["kv_usage_frac"].notna().sum() == 0:
        return False, "the samples carry no KV-usage gauge"
    return True, ""


def _counter_increase(values: Sequence[float]) -> float:
    """Sum of increases of a cumulative counter (a drop is a restart: count the new value,
    Prometheus ``increase()`` convention). NaN if fewer than one finite value."""
    v = [float(x) for x in values if x is not None and math.isfinite(float(x))]
    if not v:
        return math.nan
    total = 0.0
    for a, b in zip(v, v[1:]):
        total += b - a if b >= a else b
    return total


def _nmax(*vals: float) -> float:
    """Max of the finite values, NaN when none (no all-NaN warnings)."""
    v = [float(x) for x in vals if x is not None and math.isfinite(float(x))]
    return max(v) if v else math.nan


def _blocks(samples: pd.DataFrame) -> list[tuple[str, int, int]]:
    """Contiguous runs of one level label: (label, first row, last row), positional."""
    out: list[tuple[str, int, int]] = []
    labels = samples["level"].tolist()
    start = 0
    for i in range(1, len(labels) + 1):
        if i == len(labels) or labels[i] != labels[start]:
            lab = labels[start]
            if lab is not None and not (isinstance(lab, float) and math.isnan(lab)):
                out.append((str(lab), start, i - 1))
            start = i
    return out


def kv_residency(samples: pd.DataFrame, kv_threshold_frac: float = 0.9) -> pd.DataFrame:
    """KV-cache pressure per load level from :func:`servelab.metrics.load_samples`.

    One row per level label, in run order: samples, t_start_s, t_end_s,
    kv_usage_max_frac, kv_usage_mean_frac, running_max, waiting_max, preemptions_delta
    (increase of the cumulative preemption counter -- vLLM preemptions, SGLang
    retractions -- from the sample *before* the level's first sample to its last, so an
    event between two levels is charged to the later one), retracted_max (SGLang
    per-interval gauge), crowded_samples (samples with ``waiting > 0`` while KV usage >=
    ``kv_threshold_frac``). Samples without a level label (before the first level) only
    serve as baseline. Empty when the metrics were unavailable.
    """
    cols = ["level", "samples", "t_start_s", "t_end_s", "kv_usage_max_frac", "kv_usage_mean_frac",
            "running_max", "waiting_max", "preemptions_delta", "retracted_max", "crowded_samples"]
    ok, _ = _metrics_available(samples)
    if not ok:
        return pd.DataFrame(columns=cols)
    s = samples.sort_values("t_s", kind="stable").reset_index(drop=True)
    pre = s["preemptions_total"] if "preemptions_total" in s.columns else pd.Series(np.nan, index=s.index)
    retr = s["retracted_reqs"] if "retracted_reqs" in s.columns else pd.Series(np.nan, index=s.index)
    acc: dict[str, dict[str, Any]] = {}
    for lab, a, b in _blocks(s):
        g = s.iloc[a:b + 1]
        kv = g["kv_usage_frac"].astype(float)
        wait = g["waiting"].astype(float)
        crowded = int(((wait > 0) & (kv >= kv_threshold_frac)).sum())
        inc = _counter_increase(pre.iloc[max(0, a - 1):b + 1].tolist())
        r = acc.setdefault(lab, {"level": lab, "samples": 0, "t_start_s": float(g["t_s"].iloc[0]),
                                 "t_end_s": math.nan, "kv_usage_max_frac": math.nan, "_kv_sum": 0.0, "_kv_n": 0,
                                 "running_max": math.nan, "waiting_max": math.nan, "preemptions_delta": math.nan,
                                 "retracted_max": math.nan, "crowded_samples": 0})
        r["samples"] += len(g)
        r["t_end_s"] = float(g["t_s"].iloc[-1])
        r["kv_usage_max_frac"] = _nmax(r["kv_usage_max_frac"], kv.max())
        r["_kv_sum"] += float(kv.sum(skipna=True))
        r["_kv_n"] += int(kv.notna().sum())
        r["running_max"] = _nmax(r["running_max"], g["running"].astype(float).max())
        r["waiting_max"] = _nmax(r["waiting_max"], wait.max())
        if math.isfinite(inc):
            prev = r["preemptions_delta"]
            r["preemptions_delta"] = (prev if math.isfinite(prev) else 0.0) + inc
        r["retracted_max"] = _nmax(r["retracted_max"], retr.iloc[a:b + 1].astype(float).max())
        r["crowded_samples"] += crowded
    rows = []
    for r in acc.values():
        r["kv_usage_mean_frac"] = r.pop("_kv_sum") / r["_kv_n"] if r["_kv_n"] else math.nan
        r.pop("_kv_n")
        rows.append(r)
    return pd.DataFrame(rows, columns=cols)


def kv_verdict(samples: pd.DataFrame, kv_threshold_frac: float = 0.9, facts: Mapping[str, Any] | None = None,
               kv_memory_bytes: Any = None, engine_args: Mapping[str, Any] | None = None,
               kv_dtype: str | None = None, tensor_parallel_size: int | None = None) -> dict[str, Any]:
    """Does the KV cache limit concurrency in this run? One dict with the numbers.

    Rule: ``limited`` is True when some sample shows requests waiting (``waiting > 0``)
    while KV usage is >= ``kv_threshold_frac`` (90 %), or the preemption counter (vLLM
    ``num_preemptions``, SGLang ``num_retracted_requests``) increased, or SGLang's
    retraction gauge was ever > 0. Otherwise "not limited" -- including when /metrics was
    unavailable, which the sentence says (``assessed`` False).

    With ``facts`` and a KV budget (``kv_memory_bytes``, or ``kv-cache-memory-bytes`` in
    ``engine_args`` = run.json ``engine_params`` or its ``args``), the prediction from
    model facts is compared with the server's ``kv_capacity_tokens``
    (:func:`kv_capacity_check`; ``kv-cache-dtype``, ``tensor-parallel-size`` and
    ``block-size`` are read from the args unless given).

    Keys: limited, assessed, sentence, kv_usage_max_frac, waiting_max, running_max,
    preemptions_delta, levels_limited, residency (the :func:`kv_residency` frame) and,
    when compared, capacity (the :func:`kv_capacity_check` dict).
    """
    args = _engine_args(engine_args)
    out: dict[str, Any] = {"limited": False, "assessed": False, "sentence": "", "kv_usage_max_frac": math.nan,
                           "waiting_max": math.nan, "running_max": math.nan, "preemptions_delta": math.nan,
                           "levels_limited": [], "residency": pd.DataFrame()}
    ok, why = _metrics_available(samples)
    cap_sentence = ""
    mem = kv_memory_bytes if kv_memory_bytes is not None else _arg(args, "kv-cache-memory-bytes")
    if facts is not None and mem is not None:
        server_cap = math.nan
        if ok and "kv_capacity_tokens" in samples.columns and samples["kv_capacity_tokens"].notna().any():
            server_cap = float(samples["kv_capacity_tokens"].dropna().iloc[-1])
        block = None
        if ok and "block_size" in samples.columns and samples["block_size"].notna().any():
            block = int(samples["block_size"].dropna().iloc[-1])
        elif _arg(args, "block-size"):
            block = int(_arg(args, "block-size"))
        cap = kv_capacity_check(
            facts, mem, server_cap, block_size=block,
            kv_dtype=kv_dtype or _arg(args, "kv-cache-dtype") or "auto",
            tensor_parallel_size=tensor_parallel_size or int(_arg(args, "tensor-parallel-size") or 1))
        override = _arg(args, "num-gpu-blocks-override")
        if override and block:  # the block count was forced: that, not the memory budget, sets capacity
            forced = int(override) * block
            cap["predicted_capacity_tokens"] = forced
            cap["diff_pct"] = _pct_change(server_cap, forced)
            agree = "agrees" if abs(cap["diff_pct"]) < 1.0 else "differs"
            cap["sentence"] = (f"num-gpu-blocks-override {int(override)} x block size {block} fixes the cache at "
                               f"{forced:,} tokens (the {cap['kv_memory_bytes']:,}-byte budget alone would hold "
                               f"{kv_capacity(cap['kv_memory_bytes'], cap['kv_bytes_per_token'], block):,}); the "
                               f"server reports {int(server_cap):,}: {agree}." if math.isfinite(server_cap) else
                               f"num-gpu-blocks-override fixes the cache at {forced:,} tokens.")
        out["capacity"] = cap
        cap_sentence = " " + cap["sentence"]
    if not ok:
        out["sentence"] = (f"Not limited as far as this run can show: /metrics was unavailable ({why}), so KV "
                           f"usage, queueing and preemptions were not observed.{cap_sentence}")
        return out
    res = kv_residency(samples, kv_threshold_frac)
    s = samples.sort_values("t_s", kind="stable")
    kv = s["kv_usage_frac"].astype(float)
    wait = s["waiting"].astype(float)
    crowded = (wait > 0) & (kv >= kv_threshold_frac)
    pre = _counter_increase(s["preemptions_total"].tolist()) if "preemptions_total" in s.columns else math.nan
    retr_max = float(s["retracted_reqs"].astype(float).max()) if "retracted_reqs" in s.columns else math.nan
    kv_max = float(kv.max())
    out.update(assessed=True, kv_usage_max_frac=kv_max, waiting_max=float(wait.max()),
               running_max=float(s["running"].astype(float).max()), preemptions_delta=pre, residency=res)
    peak_level = None
    if len(res) and res["kv_usage_max_frac"].notna().any():
        peak_level = res.loc[res["kv_usage_max_frac"].idxmax(), "level"]
    limited_levels = res.loc[(res["crowded_samples"] > 0) | (res["preemptions_delta"].fillna(0) > 0)
                             | (res["retracted_max"].fillna(0) > 0), "level"].tolist()
    limited = bool(crowded.any() or (math.isfinite(pre) and pre > 0) or (math.isfinite(retr_max) and retr_max > 0))
    out["limited"] = limited
    out["levels_limited"] = limited_levels
    pre_txt = f"{pre:.0f} preemption(s)" if math.isfinite(pre) else "preemptions not exposed"
    if limited:
        parts = []
        if crowded.any():
            parts.append(f"up to {int(wait[crowded].max())} request(s) waited while KV usage was >= "
                         f"{kv_threshold_frac:.0%} (peak {kv_max:.1%})")
        if math.isfinite(pre) and pre > 0:
            parts.append(f"the server preempted {pre:.0f} time(s)")
        if math.isfinite(retr_max) and retr_max > 0:
            parts.append(f"SGLang retracted up to {retr_max:.0f} request(s) per log interval")
        where = f" at {', '.join(limited_levels)}" if limited_levels else ""
        out["sentence"] = f"KV cache limits concurrency{where}: " + "; ".join(parts) + "." + cap_sentence
    else:
        extra = ""
        if wait.max() > 0:
            extra = (f" Up to {int(wait.max())} request(s) waited with KV usage below {kv_threshold_frac:.0%}: "
                     "the queue comes from a scheduler limit (e.g. max-num-seqs or the batch-token budget), "
                     "not from the KV cache.")
        at = f" (at {peak_level})" if peak_level else ""
        out["sentence"] = (f"KV cache did not limit concurrency: peak KV usage {kv_max:.1%}{at}, no request "
                           f"waited while KV usage was >= {kv_threshold_frac:.0%}, {pre_txt}.{extra}{cap_sentence}")
    return out


def kv_timeseries(samples: pd.DataFrame, title: str = "KV cache and scheduler over time") -> plt.Figure:
    """KV usage %, running and waiting requests and cumulative preemptions against
    sampler time, with a dotted line and a label at the start of every load level.
    Without samples the figure says so instead of plotting."""
    fig, axes = plt.subplots(3, 1, figsize=(8, 6.4), sharex=True)
    ok, why = _metrics_available(samples)
    if not ok:
        for ax in axes:
            ax.set_axis_off()
        axes[1].text(0.5, 0.5, f"no /metrics samples: {why}", ha="center", va="center", transform=axes[1].transAxes)
        fig.suptitle(title)
        return fig
    s = samples.sort_values("t_s", kind="stable").reset_index(drop=True)
    t = s["t_s"].astype(float)
    axes[0].plot(t, s["kv_usage_frac"].astype(float) * 100, color="tab:blue", lw=1.2)
    axes[0].axhline(90, color="tab:red", ls=":", lw=0.8)
    axes[0].set_ylabel("KV usage %")
    axes[0].set_ylim(0, 105)
    axes[1].step(t, s["running"].astype(float), where="post", label="running", color="tab:green")
    axes[1].step(t, s["waiting"].astype(float), where="post", label="waiting", color="tab:orange")
    axes[1].set_ylabel("requests")
    axes[1].legend(fontsize=8, loc="upper left")
    pre = s["preemptions_total"].astype(float) if "preemptions_total" in s.columns else pd.Series(np.nan, index=s.index)
    if pre.notna().any():
        axes[2].step(t, pre - pre.dropna().iloc[0], where="post", color="tab:red")
    else:
        axes[2].text(0.5, 0.5, "preemption counter not exposed", ha="center", va="center",
                     transform=axes[2].transAxes, fontsize=8)
    axes[2].set_ylabel("preemptions\n(since start)")
    axes[2].set_xlabel("time since sampler start (s)")
    for lab, a, _ in _blocks(s):
        x0 = float(t.iloc[a])
        for ax in axes:
            ax.axvline(x0, color="grey", ls=":", lw=0.7)
        axes[0].text(x0, 104, lab, rotation=90, va="top", ha="right", fontsize=6, color="dimgrey")
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------- 5. speculative decoding


def spec_stats(samples_or_delta: pd.DataFrame | Mapping[str, Any],
               num_speculative_tokens: int | None = None) -> dict[str, Any]:
    """Speculative-decoding acceptance from server metrics.

    vLLM (counters): ``acceptance_rate = accepted_tokens / draft_tokens`` and
    ``mean_acceptance_length = 1 + accepted_tokens / drafts`` -- the convention of vLLM's
    own logger and Prometheus docs (``vllm/v1/spec_decode/metrics.py``,
    ``SpecDecodingProm``: "mean acceptance length (conventionally including bonus
    tokens)"), i.e. tokens emitted per verification step. SGLang: its
    ``spec_accept_length`` gauge (accepted tokens per verify step over the last log
    interval), averaged over samples with requests running; ``acceptance_rate =
    (length - 1) / num_speculative_tokens`` when the latter is given.

    Input: a samples frame (counters differenced from its first to its last row; pass a
    slice for one level) or a :func:`servelab.metrics.delta` dict of increments.
    """
    out: dict[str, Any] = {"engine": None, "drafts": math.nan, "draft_tokens": math.nan, "accepted_tokens": math.nan,
                           "acceptance_rate": math.nan, "mean_acceptance_length": math.nan, "source": "", "note": ""}
    if isinstance(samples_or_delta, pd.DataFrame):
        s = samples_or_delta
        if "t_s" in s.columns:
            s = s.sort_values("t_s", kind="stable")

        def inc(col: str) -> float:
            return _counter_increase(s[col].tolist()) if col in s.columns else math.nan

        drafts, dtok, acc = inc("spec_drafts_total"), inc("spec_draft_tokens_total"), inc("spec_accepted_tokens_total")
        gauge = math.nan
        if "spec_accept_length" in s.columns:
            g = s
            if "running" in s.columns:
                g = s[s["running"].astype(float) > 0]
            vals = g["spec_accept_length"].astype(float).dropna()
            vals = vals[vals > 0]
            gauge = float(vals.mean()) if len(vals) else math.nan
        if "engine" in s.columns and s["engine"].notna().any():
            out["engine"] = str(s["engine"].dropna().iloc[-1])
    else:
        d = samples_or_delta
        drafts, dtok, acc = (_num(d.get("spec_drafts_total")), _num(d.get("spec_draft_tokens_total")),
                             _num(d.get("spec_accepted_tokens_total")))
        gauge = _num(d.get("spec_accept_length"))
        out["engine"] = d.get("engine")
    k = num_speculative_tokens
    if not math.isfinite(drafts) and math.isfinite(dtok) and k:
        drafts = dtok / k  # every draft proposes k tokens
    out.update(drafts=drafts, draft_tokens=dtok, accepted_tokens=acc)
    if math.isfinite(dtok) and dtok > 0 and math.isfinite(acc):
        out["acceptance_rate"] = acc / dtok
        if math.isfinite(drafts) and drafts > 0:
            out["mean_acceptance_length"] = 1.0 + acc / drafts
        out["source"] = "vLLM counters: accepted/draft tokens; 1 + accepted/drafts (vllm/v1/spec_decode/metrics.py)"
    elif math.isfinite(gauge):
        out["mean_acceptance_length"] = gauge
        if k:
            out["acceptance_rate"] = (gauge - 1.0) / k
        out["source"] = "SGLang gauge spec_accept_length (mean over samples with running requests)"
    else:
        out["note"] = "no speculative-decoding metrics (speculation off, or the engine does not expose them)"
    return out


def _single_config(summary: pd.DataFrame, what: str) -> pd.DataFrame:
    cfgs = _ordered(summary["config"])
    if len(cfgs) != 1:
        raise ValueError(f"{what} must hold exactly one configuration, got {cfgs}; filter it first")
    return summary


def spec_ab(summary_base: pd.DataFrame, summary_spec: pd.DataFrame) -> pd.DataFrame:
    """Speculation off (``summary_base``) against on (``summary_spec``), per level present
    in both (matched on bucket, target tokens and concurrency): aggregate output tok/s,
    per-request decode tok/s (p50) and TTFT p50, each with ``*_change_pct`` = (spec - base)
    / base * 100. Each summary must hold one configuration."""
    _single_config(summary_base, "summary_base")
    _single_config(summary_spec, "summary_spec")
    keys = ["bucket", "target_input_tokens", "target_output_tokens", "concurrency"]
    keys = [k for k in keys if k in summary_base.columns and k in summary_spec.columns]
    metrics = ["aggregate_output_tps", "decode_tps_p50", "ttft_p50_s"]
    m = summary_base[keys + metrics].merge(summary_spec[keys + metrics], on=keys, suffixes=("_base", "_spec"))
    for col in metrics:
        m[f"{col}_change_pct"] = [_pct_change(s, b) for s, b in zip(m[f"{col}_spec"], m[f"{col}_base"])]
    m.insert(0, "config_spec", summary_spec["config"].iloc[0])
    m.insert(0, "config_base", summary_base["config"].iloc[0])
    return m.sort_values(["bucket", "concurrency"], kind="stable").reset_index(drop=True)


def derive_capture_sizes(concurrency_levels: Iterable[int], k: int) -> list[int]:
    """CUDA-graph capture sizes a study needs: every concurrency ``c`` (prefill-free decode
    steps without speculation) and ``c * (1 + k)`` (a decode step verifying ``k``
    speculative tokens per request), sorted and unique. Seed 001: MTP k=1 at c=4 -> 8."""
    out: set[int] = set()
    for c in concurrency_levels:
        c = int(c)
        out.add(c)
        out.add(c * (1 + int(k)))
    return sorted(out)


def capture_size_warnings(engine_args: Mapping[str, Any], concurrency_levels: Iterable[int]) -> list[str]:
    """Warn when a decode step of some load level will not run on a captured CUDA graph.

    ``engine_args`` is run.json ``engine_params`` or its ``args`` (flags as given to
    ``vllm serve``; JSON strings are parsed). With ``speculative-config`` carrying
    ``num_speculative_tokens`` k (0 without speculation), each request adds ``1 + k``
    tokens to a decode step, so concurrency ``c`` needs a graph of ``c * (1 + k)``.
    Only explicit ``compilation-config`` ``cudagraph_capture_sizes`` (or
    ``max_cudagraph_capture_size``) are checked -- vLLM's defaults reach far higher --
    and nothing is checked under ``enforce-eager`` or ``cudagraph_mode: NONE``.

    * Above the largest capture size, vLLM runs the step without a CUDA graph (seed 001:
      "4 requests x 2 tokens = size 8 ... falls back to normal execution and slows down
      a lot"). One warning per such concurrency.
    * Between capture sizes, vLLM pads the batch up to the next captured size (wasted
      slots); also reported. (Newer vLLM rounds sizes for FULL decode graphs up to
      multiples of 1 + k: vllm/config/compilation.py, adjust_cudagraph_sizes_for_spec_decode.)
    """
    args = _engine_args(engine_args)
    if _arg(args, "enforce-eager") is True:
        return []
    comp = _json_value(_arg(args, "compilation-config")) or {}
    if not isinstance(comp, Mapping):
        return []
    if str(comp.get("cudagraph_mode", "")).upper() == "NONE":
        return []
    sizes = comp.get("cudagraph_capture_sizes")
    sizes = sorted({int(x) for x in sizes}) if sizes else []
    max_size = comp.get("max_cudagraph_capture_size")
    largest = sizes[-1] if sizes else (int(max_size) if max_size else None)
    if largest is None:
        return []
    spec = _json_value(_arg(args, "speculative-config")) or {}
    k = int(spec.get("num_speculative_tokens") or 0) if isinstance(spec, Mapping) else 0
    method = spec.get("method") if isinstance(spec, Mapping) else None
    tokens = f" with {k} speculative token(s){f' ({method})' if method else ''}" if k else ""
    levels = sorted({int(x) for x in concurrency_levels})
    warnings: list[str] = []
    for c in levels:
        need = c * (1 + k)
        if need > largest:
            warnings.append(
                f"concurrency {c}: a decode step{tokens} processes {c} x {1 + k} = {need} tokens, above the largest "
                f"CUDA-graph capture size {largest}; vLLM runs it without CUDA graphs (eager fallback, much slower). "
                f"Add {need} to cudagraph_capture_sizes (needed: {derive_capture_sizes(levels, k)}).")
        elif sizes and need not in sizes:
            pad = min(s for s in sizes if s >= need)
            warnings.append(
                f"concurrency {c}: a decode step{tokens} processes {need} tokens, not a capture size; vLLM pads it "
                f"to the {pad} graph ({pad - need} wasted slot(s)). Add {need} to cudagraph_capture_sizes.")
    return warnings


# --------------------------------------------------------------------------- 6. one change at a time

DEFAULT_DIFF_IGNORE = ("host", "port", "startup_timeout_s")


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    d = _json_value(d)
    if isinstance(d, Mapping):
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        if not d and prefix:
            out[prefix] = None  # an empty dict is "nothing set"
        return out
    return {prefix: d}


def config_diff(engine_params_a: Mapping[str, Any], engine_params_b: Mapping[str, Any],
                ignore: Iterable[str] = DEFAULT_DIFF_IGNORE) -> list[tuple[str, Any, Any]]:
    """Every setting that differs between two configurations: ``[(path, a, b)]`` sorted by
    path, where ``path`` joins nested keys with dots (``"args.max-num-batched-tokens"``,
    ``"args.compilation-config.cudagraph_mode"``, ``"env.VLLM_ATTENTION_BACKEND"``).

    Nested dicts -- and flag values given as JSON strings -- are flattened; lists compare
    as whole values. A missing key reads as None, and None/absent compare equal (an unset
    flag). Top-level ``ignore`` paths (default: host, port, startup timeout -- where the
    engine listens, not how it serves) are skipped.
    """
    ign = set(ignore)
    fa, fb = _flatten(engine_params_a), _flatten(engine_params_b)
    out = []
    for path in sorted(set(fa) | set(fb)):
        if path.split(".", 1)[0] in ign or path in ign:
            continue
        a, b = fa.get(path), fb.get(path)
        if a != b:
            out.append((path, a, b))
    return out


def compare_configs(study_configs: Sequence[tuple[str, Mapping[str, Any]]], summary: pd.DataFrame,
                    baselines: Mapping[str, str] | None = None) -> pd.DataFrame:
    """Each configuration against its baseline (``baselines[config]``, default the previous one
    in study order), per level both measured.

    ``study_configs`` is ``[(config_id, engine_params), ...]`` (run.json ``engine_params``
    per configuration). Columns: config, baseline, changed ("path: a -> b; ..."),
    n_changed, bucket, concurrency, ttft_p50_change_pct, aggregate_change_pct,
    decode_change_pct (each ``(config - baseline) / baseline * 100``) and ``warning``:
    "not attributable: N variables differ: ..." when more than one setting changed,
    "nothing differs: ..." when none did (the change is run-to-run noise), else "".
    A configuration without levels shared with its baseline gets one row of NaNs.
    """
    cols = ["config", "baseline", "changed", "n_changed", "bucket", "concurrency", "ttft_p50_change_pct",
            "aggregate_change_pct", "decode_change_pct", "warning"]
    rows = []
    keys = [k for k in ["bucket", "target_input_tokens", "target_output_tokens", "concurrency"]
            if summary is not None and k in summary.columns]
    params = dict(study_configs)
    pairs = [((baselines or {}).get(cur_id, prev_id), cur_id)
             for (prev_id, _), (cur_id, _) in zip(study_configs, study_configs[1:])]
    for prev_id, cur_id in pairs:
        prev, cur = params[prev_id], params[cur_id]
        diff = config_diff(prev, cur)
        changed = "; ".join(f"{p}: {a!r} -> {b!r}" for p, a, b in diff)
        if len(diff) > 1:
            warning = f"not attributable: {len(diff)} variables differ: {', '.join(p for p, _, _ in diff)}"
        elif not diff:
            warning = "nothing differs: any change is run-to-run noise"
        else:
            warning = ""
        base = {"config": cur_id, "baseline": prev_id, "changed": changed, "n_changed": len(diff), "warning": warning}
        merged = pd.DataFrame()
        if summary is not None and not summary.empty:
            a = summary[summary["config"] == prev_id]
            b = summary[summary["config"] == cur_id]
            metrics = ["ttft_p50_s", "aggregate_output_tps", "decode_tps_p50"]
            merged = a[keys + metrics].merge(b[keys + metrics], on=keys, suffixes=("_a", "_b"))
        if merged.empty:
            rows.append({**base, "bucket": None, "concurrency": math.nan, "ttft_p50_change_pct": math.nan,
                         "aggregate_change_pct": math.nan, "decode_change_pct": math.nan})
            continue
        for _, r in merged.sort_values(["bucket", "concurrency"], kind="stable").iterrows():
            rows.append({**base, "bucket": r["bucket"], "concurrency": int(r["concurrency"]),
                         "ttft_p50_change_pct": _pct_change(r["ttft_p50_s_b"], r["ttft_p50_s_a"]),
                         "aggregate_change_pct": _pct_change(r["aggregate_output_tps_b"], r["aggregate_output_tps_a"]),
                         "decode_change_pct": _pct_change(r["decode_tps_p50_b"], r["decode_tps_p50_a"])})
    return pd.DataFrame(rows, columns=cols)


# --------------------------------------------------------------------------- 7. symptom table

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

    c_min = int(s["concurrency"].min()) if len(s) else None

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
