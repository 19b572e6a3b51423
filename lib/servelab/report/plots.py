"""Figures of the write-up, each a function of summary/record frames returning a matplotlib
Figure (named `<y>_vs_<x>`). One colour per configuration throughout a report
(`config_colors`), legends outside the data, units on every axis, log axes where the span is
large. Japanese labels render with a real CJK font (Debian's fonts-noto-cjk). Not for
computing metrics: fits, knees and goodput come from `servelab.analysis`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib import font_manager
from matplotlib.ticker import FixedLocator, MaxNLocator, NullLocator, ScalarFormatter

from .i18n import table, words

CJK_FONTS = ("Noto Sans CJK JP", "Noto Sans CJK SC", "IPAexGothic", "IPAGothic", "TakaoGothic")
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f",
           "#bcbd22", "#393b79", "#637939")

def _labels(lang: str) -> dict[str, str]:
    """Axis labels and legends in `lang` (report/i18n/figures.yaml `plot.*`)."""
    w = words(lang)
    return {k.removeprefix("plot."): w(k) for k in table() if k.startswith("plot.")}


def use_language(language: str) -> str | None:
    """Select a font that has the glyphs of `language`; returns the font family used."""
    if language != "ja":
        plt.rcParams["font.family"] = ["DejaVu Sans"]
        return "DejaVu Sans"
    have = {f.name for f in font_manager.fontManager.ttflist}
    for name in CJK_FONTS:
        if name in have:
            plt.rcParams["font.family"] = [name, "DejaVu Sans"]
            return name
    return None


def config_colors(config_ids: Sequence[str]) -> dict[str, str]:
    """One colour per configuration, by study order, for every figure of a report."""
    return {c: PALETTE[i % len(PALETTE)] for i, c in enumerate(config_ids)}


def _configs(df: pd.DataFrame) -> list[str]:
    return list(dict.fromkeys(df["config"]))


def _style(colors: Mapping[str, str] | None, df: pd.DataFrame) -> dict[str, str]:
    return dict(colors) if colors else config_colors(_configs(df))


def _legend_below(fig: plt.Figure, handles: list[Any], labels: list[str]) -> None:
    """The legend under the axes, outside the data, in as many columns as fit."""
    if handles:
        fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 3), fontsize=8, frameon=False,
                   bbox_to_anchor=(0.5, 0.0))


def _conc_axis(ax: Any, values: Any) -> None:
    """Log2 concurrency axis labelled with the measured levels as plain numbers."""
    ax.set_xscale("log", base=2)
    ticks = sorted({int(v) for v in values})
    if len(ticks) > 8:
        ticks = [t for i, t in enumerate(ticks) if i % 2 == 0 or t == ticks[-1]]
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_locator(NullLocator())


def _finish(fig: plt.Figure, n_legend: int) -> plt.Figure:
    rows = math.ceil(n_legend / 3) if n_legend else 0
    fig.tight_layout(rect=(0, 0.05 + 0.05 * rows, 1, 1))
    return fig


def ttft_vs_prompt_tokens(summary: pd.DataFrame, labels: Mapping[str, str] | None = None,
                          fits: Mapping[str, Mapping[str, Any]] | None = None, concurrency: int = 1,
                          colors: Mapping[str, str] | None = None, lang: str = "en") -> plt.Figure:
    """Median TTFT (ms) against actual prompt tokens at `concurrency`, one colour per
    configuration, p95 as a band and, from `fits` (analysis.fit_prefill), the fitted line."""
    L = _labels(lang)
    fig, ax = plt.subplots(figsize=(7, 4.4))
    s = summary[summary["concurrency"] == concurrency]
    col = _style(colors, summary)
    handles, names = [], []
    for cfg in _configs(s):
        d = s[s["config"] == cfg].sort_values("prompt_tokens")
        c = col.get(cfg, "black")
        h, = ax.plot(d["prompt_tokens"], d["ttft_p50_s"] * 1000, "o", color=c)
        ax.fill_between(d["prompt_tokens"], d["ttft_p50_s"] * 1000, d["ttft_p95_s"] * 1000, color=c, alpha=0.12)
        f = (fits or {}).get(cfg)
        if f and math.isfinite(f.get("slope_s_per_token", math.nan)):
            x = np.linspace(0, float(d["prompt_tokens"].max()) * 1.05, 50)
            ax.plot(x, (f["overhead_s"] + f["slope_s_per_token"] * x) * 1000, "-", color=c, lw=1.2)
        handles.append(h)
        names.append((labels or {}).get(cfg, cfg))
    ax.set_xlabel(L["prompt"])
    ax.set_ylabel(L["ttft_ms"])
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    _legend_below(fig, handles, names)
    return _finish(fig, len(names))


def throughput_vs_concurrency(summary: pd.DataFrame, labels: Mapping[str, str] | None = None,
                              goodput: pd.DataFrame | None = None, colors: Mapping[str, str] | None = None,
                              lang: str = "en") -> plt.Figure:
    """Saturation curves: aggregate output tok/s (range over rounds as error bars) against
    concurrency, one panel per bucket, log2 x; the goodput level of each configuration
    (analysis.goodput) marked with a star."""
    L = _labels(lang)
    buckets = list(dict.fromkeys(summary["bucket"]))
    fig, axes = plt.subplots(1, len(buckets), figsize=(3.4 * len(buckets) + 0.6, 3.9), squeeze=False)
    col = _style(colors, summary)
    handles: dict[str, Any] = {}
    for j, b in enumerate(buckets):
        ax = axes[0][j]
        s = summary[summary["bucket"] == b]
        for cfg in _configs(s):
            d = s[s["config"] == cfg].sort_values("concurrency")
            c = col.get(cfg, "black")
            h = ax.errorbar(d["concurrency"], d["aggregate_output_tps"],
                            yerr=[d["aggregate_output_tps"] - d["aggregate_output_tps_min"],
                                  d["aggregate_output_tps_max"] - d["aggregate_output_tps"]],
                            marker="o", ms=4, capsize=2, color=c, lw=1.2)
            handles.setdefault((labels or {}).get(cfg, cfg), h)
            if goodput is not None and len(goodput):
                g = goodput[(goodput["config"] == cfg) & (goodput["bucket"] == b)]
                if len(g) and pd.notna(g["goodput_concurrency"].iloc[0]):
                    ax.plot([g["goodput_concurrency"].iloc[0]], [g["aggregate_output_tps"].iloc[0]], "*", ms=13,
                            color=c, markeredgecolor="black", zorder=5)
        ax.set_title(b, fontsize=9)
        _conc_axis(ax, s["concurrency"])
        ax.set_xlabel(L["conc"], fontsize=8)
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
    axes[0][0].set_ylabel(L["agg"])
    names = list(handles)
    hs = list(handles.values())
    if goodput is not None and len(goodput):
        hs.append(plt.Line2D([], [], marker="*", ls="", ms=11, color="grey", markeredgecolor="black"))
        names.append(L["goodput"])
    _legend_below(fig, hs, names)
    return _finish(fig, len(names))


def latency_vs_concurrency(summary: pd.DataFrame, labels: Mapping[str, str] | None = None,
                           slo_ttft_p95_s: float | None = None, colors: Mapping[str, str] | None = None,
                           lang: str = "en") -> plt.Figure:
    """TTFT p95 (s, log) and per-request decode tok/s against concurrency, one column per
    bucket; the SLO's p95 TTFT as a dashed line."""
    L = _labels(lang)
    buckets = list(dict.fromkeys(summary["bucket"]))
    fig, axes = plt.subplots(2, len(buckets), figsize=(3.4 * len(buckets) + 0.6, 5.6), squeeze=False, sharex="col")
    col = _style(colors, summary)
    handles: dict[str, Any] = {}
    for j, b in enumerate(buckets):
        s = summary[summary["bucket"] == b]
        for cfg in _configs(s):
            d = s[s["config"] == cfg].sort_values("concurrency")
            c = col.get(cfg, "black")
            h, = axes[0][j].plot(d["concurrency"], d["ttft_p95_s"], marker="o", ms=4, color=c, lw=1.2)
            axes[1][j].plot(d["concurrency"], d["decode_tps_p50"], marker="s", ms=4, color=c, lw=1.2)
            handles.setdefault((labels or {}).get(cfg, cfg), h)
        if slo_ttft_p95_s:
            axes[0][j].axhline(slo_ttft_p95_s, color="black", ls="--", lw=0.9)
        axes[0][j].set_title(b, fontsize=9)
        axes[0][j].set_yscale("log")
        axes[1][j].set_xlabel(L["conc"], fontsize=8)
        axes[1][j].set_ylim(bottom=0)
        for ax in axes[:, j]:
            _conc_axis(ax, s["concurrency"])
            ax.grid(alpha=0.3)
    axes[0][0].set_ylabel(L["ttft95"])
    axes[1][0].set_ylabel(L["decode"])
    names, hs = list(handles), list(handles.values())
    if slo_ttft_p95_s:
        hs.append(plt.Line2D([], [], color="black", ls="--", lw=0.9))
        names.append(f"{L['slo']}: p95 TTFT {slo_ttft_p95_s:g} s")
    _legend_below(fig, hs, names)
    return _finish(fig, len(names))


def pareto_frontier(points: pd.DataFrame, x: str, y: str) -> pd.DataFrame:
    """The points no other point beats on both `x` and `y` (higher is better), sorted by x."""
    p = points.dropna(subset=[x, y]).reset_index(drop=True).sort_values([x, y], ascending=[False, False])
    keep, best_y = [], -math.inf
    for i, r in p.iterrows():
        if r[y] > best_y:
            keep.append(i)
            best_y = r[y]
    return p.loc[keep].sort_values(x)


def per_user_vs_per_gpu(summary: pd.DataFrame, gpus: Mapping[str, int], labels: Mapping[str, str] | None = None,
                        colors: Mapping[str, str] | None = None, lang: str = "en") -> plt.Figure:
    """AIPerf/vLLM-sweep style Pareto figure: per-user decode tok/s against aggregate output
    tok/s per GPU for every measured level, one colour per configuration, the frontier over
    all configurations as a step line."""
    L = _labels(lang)
    s = summary.copy()
    s["per_gpu"] = s["aggregate_output_tps"] / s["config"].map(lambda c: max(1, int(gpus.get(c, 1))))
    fig, ax = plt.subplots(figsize=(7, 4.6))
    col = _style(colors, summary)
    handles, names = [], []
    for cfg in _configs(s):
        d = s[s["config"] == cfg]
        h = ax.scatter(d["per_gpu"], d["decode_tps_p50"], s=22, color=col.get(cfg, "black"), alpha=0.85)
        handles.append(h)
        names.append((labels or {}).get(cfg, cfg))
    f = pareto_frontier(s, "per_gpu", "decode_tps_p50")
    if len(f) > 1:
        h, = ax.step(f["per_gpu"], f["decode_tps_p50"], where="post", color="black", lw=1, ls="--")
        handles.append(h)
        names.append(L["frontier"])
    ax.set_xscale("log")
    ax.set_xlabel(L["per_gpu"])
    ax.set_ylabel(L["per_user"])
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3, which="both")
    _legend_below(fig, handles, names)
    return _finish(fig, len(names))


def kv_vs_time(samples: pd.DataFrame, color: str = "#1f77b4", lang: str = "en") -> plt.Figure:
    """KV usage %, running and waiting requests and cumulative preemptions against time, with a
    dotted line at the start of every load level (short level labels beside them)."""
    L = _labels(lang)
    fig, axes = plt.subplots(3, 1, figsize=(8, 5.8), sharex=True)
    s = samples.sort_values("t_s", kind="stable").reset_index(drop=True)
    t = s["t_s"].astype(float)
    axes[0].plot(t, s["kv_usage_frac"].astype(float) * 100, color=color, lw=1.1)
    axes[0].axhline(90, color="black", ls=":", lw=0.8)
    axes[0].set_ylabel(L["kv"])
    axes[0].set_ylim(0, 105)
    r, = axes[1].step(t, s["running"].astype(float), where="post", color=color, lw=1.1)
    w, = axes[1].step(t, s["waiting"].astype(float), where="post", color="black", lw=1.1, ls="--")
    axes[1].set_ylabel(L["reqs"])
    axes[1].legend([r, w], [L["running"], L["waiting"]], fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0),
                   frameon=False)
    pre = s["preemptions_total"].astype(float) if "preemptions_total" in s else pd.Series(np.nan, index=s.index)
    if pre.notna().any():
        axes[2].step(t, pre - pre.dropna().iloc[0], where="post", color=color, lw=1.1)
    top = max(1.0, float((pre - pre.dropna().iloc[0]).max()) * 1.05) if pre.notna().any() else 1.0
    axes[2].set_ylim(-0.04 * top, top)  # a count: no negative ticks; a flat 0 stays visible above the axis
    axes[2].yaxis.set_major_locator(MaxNLocator(integer=True, nbins=4))
    axes[2].set_ylabel(L["preempt"])
    axes[2].set_xlabel(L["time"])
    labels = s["level"].tolist()
    starts = [i for i in range(len(labels)) if isinstance(labels[i], str) and (i == 0 or labels[i] != labels[i - 1])]
    gap = 0.07 * max(float(t.max() - t.min()), 1e-9)  # a label's width: closer starts keep their line only
    last = -math.inf
    for i in starts:
        for ax in axes:
            ax.axvline(float(t.iloc[i]), color="grey", ls=":", lw=0.6)
        if float(t.iloc[i]) - last >= gap:
            axes[0].text(float(t.iloc[i]), 103, labels[i].replace("-out", "/").replace(" c=", "\nc="), fontsize=5,
                         va="top", ha="left", color="dimgrey")
            last = float(t.iloc[i])
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def effect_vs_knob(points: pd.DataFrame, knob: str, knee: Mapping[str, float] | None = None,
                   lang: str = "en") -> plt.Figure:
    """A one-knob sweep: the change of aggregate output tok/s against the reference (95 % interval as
    error bars) against the knob's value, one line per level, log2 x for a numeric knob; the knee of
    each level (the smallest value within 10 %) marked; the -10 % line dashed. `points`: level,
    value, effect, ci_low, ci_high (relative)."""
    L = _labels(lang)
    fig, ax = plt.subplots(figsize=(6.4, 3.9))
    handles, names = [], []
    for i, (lv, g) in enumerate(points.groupby("level", sort=False)):
        g = g.sort_values("value")
        c = PALETTE[i % len(PALETTE)]
        h = ax.errorbar(g["value"], g["effect"] * 100, yerr=[(g["effect"] - g["ci_low"]) * 100,
                                                           (g["ci_high"] - g["effect"]) * 100],
                        marker="o", ms=4, capsize=2, color=c, lw=1.2)
        handles.append(h)
        names.append(lv)
        if knee and lv in knee:
            row = g[g["value"] == knee[lv]]
            if len(row):
                ax.plot([knee[lv]], [float(row["effect"].iloc[0]) * 100], "D", ms=8, color=c,
                        markeredgecolor="black", zorder=5)
    ax.axhline(-10, color="grey", ls="--", lw=0.8)
    ax.axhline(0, color="black", lw=0.6)
    if points["value"].min() > 0:
        ax.set_xscale("log", base=2)
        vals = sorted(points["value"].unique())
        ax.set_xticks(vals)
        ax.set_xticklabels([f"{v:g}" for v in vals])
    ax.set_xlabel(knob, fontsize=8)
    ax.set_ylabel(L["effect_pct"])
    ax.grid(alpha=0.3)
    if knee:
        handles.append(plt.Line2D([], [], marker="D", ls="", ms=7, color="grey", markeredgecolor="black"))
        names.append(L["knee"])
    _legend_below(fig, handles, names)
    return _finish(fig, len(names))


def time_law(law: Mapping[str, Any], knob: str, lang: str = "en") -> plt.Figure:
    """c=1 decode time against a knob's value: the measured points and the least-squares line with
    its slope's 95 % interval as a band (`report.why.time_law`)."""
    L = _labels(lang)
    xs = np.array([p[0] for p in law["points"]], dtype=float)
    ys = np.array([p[1] for p in law["points"]], dtype=float) * 1000
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    grid = np.linspace(0, xs.max() * 1.05, 50)
    a = law["intercept"] * 1000
    lo, hi = (s * 1000 for s in law["slope_ci"])
    ax.fill_between(grid, a + lo * grid, a + hi * grid, color=PALETTE[0], alpha=0.15, lw=0)
    line, = ax.plot(grid, a + law["slope"] * 1000 * grid, color=PALETTE[0], lw=1.2)
    dots, = ax.plot(xs, ys, "o", color=PALETTE[1], ms=5)
    ax.set_xlabel(knob, fontsize=8)
    ax.set_ylabel(L["tpot_c1_ms"])
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    _legend_below(fig, [dots, line], [L["measured"], L["fit"]])
    return _finish(fig, 2)


BUCKET_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "h")
_NICE_PCT = (-90, -75, -50, -25, -10, -5, 0, 5, 10, 25, 50, 100, 200, 400, 800, 1600, 3200)


def _pct_axis(ax: Any, lo: float, hi: float) -> None:
    """A log axis of the ratio (1 + change) labelled in percent change: a change and its interval are
    symmetric there (the verdicts' model is on the log scale), and +400 % and -5 % fit one axis."""
    ax.set_xscale("log")
    gap = math.log(hi / lo) / 7  # ticks at least a seventh of the axis apart, 0 always among them
    ticks = [0]
    for t in (x for x in _NICE_PCT if x > 0 and 1 + x / 100 <= hi):
        if math.log((1 + t / 100) / (1 + ticks[-1] / 100)) >= gap:
            ticks.append(t)
    for t in (x for x in reversed(_NICE_PCT) if x < 0 and 1 + x / 100 >= lo):
        if math.log((1 + ticks[0] / 100) / (1 + t / 100)) >= gap:
            ticks.insert(0, t)
    ax.xaxis.set_major_locator(FixedLocator([1 + t / 100 for t in ticks]))
    ax.set_xticklabels([f"{t:+d} %" if t else "0" for t in ticks], fontsize=7)
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlim(lo, hi)


def change_vs_configuration(points: pd.DataFrame, labels: Mapping[str, str] | None = None,
                            colors: Mapping[str, str] | None = None, lang: str = "en") -> plt.Figure:
    """The progression in one picture: each comparison's change against its baseline (a row, in the
    configuration's colour) with its 95 % interval, on a single request's decode tok/s at one request in
    flight (left) and aggregate tok/s at the most requests in flight (right); one marker shape per
    bucket, filled where the verdict is faster or slower, hollow where no change was detected; the A/A
    pairs (a setting against itself) under a dashed line, their labels grey. `points`:
    `report.verdicts.lead_points` (config, aa, panel, bucket, concurrency, effect, lo, hi, verdict)."""
    import textwrap

    L = _labels(lang)
    panels = [p for p in ("decode_tps_steady", "aggregate_output_tps") if (points["panel"] == p).any()]
    rows = list(dict.fromkeys(points["config"]))
    aa = dict(zip(points["config"], points["aa"]))
    buckets = list(dict.fromkeys(points["bucket"]))
    marker = {b: BUCKET_MARKERS[i % len(BUCKET_MARKERS)] for i, b in enumerate(buckets)}
    col = dict(colors) if colors else config_colors(rows)
    step = 0.7 / max(len(buckets), 1)
    names = [(labels or {}).get(c, c) + (" (A/A)" if aa[c] else "") for c in rows]
    wrapped = ["\n".join(textwrap.wrap(n, 34)) for n in names]
    row_in = max(0.42, 0.14 * max(x.count("\n") + 1 for x in wrapped))
    fig, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels) + 2.4, row_in * len(rows) + 1.5),
                             squeeze=False, sharey=True)
    ratios = np.concatenate([1 + points["lo"].to_numpy(float), 1 + points["hi"].to_numpy(float)])
    lo, hi = min(ratios.min(), 0.9), max(ratios.max(), 1.1)
    pad = (hi / lo) ** 0.06
    for ax, panel in zip(axes[0], panels):
        d = points[points["panel"] == panel]
        for r in d.itertuples():
            y = rows.index(r.config) + (buckets.index(r.bucket) - (len(buckets) - 1) / 2) * step
            c = col.get(r.config, "black")
            found = r.verdict in ("faster", "slower")
            ax.plot([1 + r.lo, 1 + r.hi], [y, y], color=c, lw=1.6, solid_capstyle="butt")
            ax.plot([1 + r.effect], [y], marker[r.bucket], ms=6, color=c, markeredgecolor=c,
                    markerfacecolor=c if found else "white", markeredgewidth=1.3, zorder=3)
            if found:  # the number beside it, outside the interval, on the side with room
                right = math.log((1 + r.hi) * pad / lo) < 0.8 * math.log(hi / lo * pad * pad)
                ax.annotate(f"{r.effect * 100:+.0f} %" if abs(r.effect) >= 0.1 else f"{r.effect * 100:+.1f} %",
                            (1 + (r.hi if right else r.lo), y), xytext=(4 if right else -4, 0),
                            textcoords="offset points", ha="left" if right else "right", va="center",
                            fontsize=6.5, color=c, bbox={"fc": "white", "ec": "none", "pad": 0.4, "alpha": 0.85})
        ax.axvline(1.0, color="black", lw=0.8)
        first_aa = next((i for i, x in enumerate(rows) if aa[x]), None)
        if first_aa:
            ax.axhline(first_aa - 0.5, color="grey", ls="--", lw=0.7)
        _pct_axis(ax, lo / pad, hi * pad)
        ax.grid(alpha=0.3, axis="x")
        cs = sorted({int(x) for x in d["concurrency"]})
        title = (L["lead_decode"] if panel == "decode_tps_steady" else
                 L["lead_agg"].format(c=cs[0]) if len(cs) == 1 else L["lead_agg_most"].format(lo=cs[0], hi=cs[-1]))
        ax.set_title(title, fontsize=9)
        ax.set_xlabel(L["lead_change"], fontsize=8)
    ax0 = axes[0][0]
    ax0.set_ylim(len(rows) - 0.5, -0.5)
    ax0.set_yticks(range(len(rows)))
    ax0.set_yticklabels(wrapped, fontsize=8)
    for t, c in zip(ax0.get_yticklabels(), rows):
        if aa[c]:
            t.set_color("dimgrey")
            t.set_fontstyle("italic")
    hs = [plt.Line2D([], [], marker=marker[b], ls="", ms=6, color="dimgrey") for b in buckets]
    hs += [plt.Line2D([], [], marker="o", ls="", ms=6, color="black"),
           plt.Line2D([], [], marker="o", ls="", ms=6, color="black", markerfacecolor="white")]
    fig.legend(hs, [*buckets, L["lead_found"], L["lead_none"]], loc="lower center", ncol=min(len(hs), 5),
               fontsize=8, frameon=False, bbox_to_anchor=(0.5, 0.0))
    legend_in = 0.35 + 0.2 * (math.ceil(len(hs) / 5) - 1)  # the legend's rows under the axes, in inches
    fig.tight_layout(rect=(0, legend_in / fig.get_figheight(), 1, 1))
    return fig
