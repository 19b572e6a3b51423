"""Figures for notebooks and reports, each a function of summary/record frames returning a
matplotlib Figure (named `<y>_vs_<x>`). Japanese labels render with a real CJK font when one
is installed (Noto Sans CJK from Debian's fonts-noto-cjk). Not for computing metrics."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib import font_manager

CJK_FONTS = ("Noto Sans CJK JP", "Noto Sans CJK SC", "IPAexGothic", "IPAGothic", "TakaoGothic")


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


def _configs(df: pd.DataFrame) -> list[str]:
    return list(dict.fromkeys(df["config"]))


def ttft_vs_prompt_tokens(summary: pd.DataFrame, labels: dict[str, str] | None = None,
                          concurrency: int | None = None, title: str = "TTFT vs prompt length") -> plt.Figure:
    """Median TTFT (ms) against actual prompt tokens, one line per configuration, at the lowest
    concurrency (or the one given); p95 as a shaded band."""
    fig, ax = plt.subplots(figsize=(6.4, 4))
    c = concurrency or int(summary["concurrency"].min())
    s = summary[summary["concurrency"] == c]
    for cfg in _configs(s):
        d = s[s["config"] == cfg].sort_values("prompt_tokens")
        ax.plot(d["prompt_tokens"], d["ttft_p50_s"] * 1000, marker="o", label=(labels or {}).get(cfg, cfg))
        ax.fill_between(d["prompt_tokens"], d["ttft_p50_s"] * 1000, d["ttft_p95_s"] * 1000, alpha=0.15)
    ax.set_xlabel("prompt tokens")
    ax.set_ylabel("TTFT p50 (ms); band to p95")
    ax.set_title(f"{title} (concurrency {c})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def throughput_vs_concurrency(summary: pd.DataFrame, labels: dict[str, str] | None = None,
                              title: str = "Throughput vs concurrency") -> plt.Figure:
    """Aggregate output tok/s (with min-max range across rounds) and per-request decode tok/s
    against concurrency, one panel per bucket."""
    buckets = list(dict.fromkeys(summary["bucket"]))
    fig, axes = plt.subplots(2, len(buckets), figsize=(3.6 * len(buckets), 6), squeeze=False, sharex=True)
    for j, b in enumerate(buckets):
        s = summary[summary["bucket"] == b]
        for cfg in _configs(s):
            d = s[s["config"] == cfg].sort_values("concurrency")
            lab = (labels or {}).get(cfg, cfg)
            axes[0][j].errorbar(d["concurrency"], d["aggregate_output_tps"],
                                yerr=[d["aggregate_output_tps"] - d["aggregate_output_tps_min"],
                                      d["aggregate_output_tps_max"] - d["aggregate_output_tps"]],
                                marker="o", capsize=3, label=lab)
            axes[1][j].plot(d["concurrency"], d["decode_tps_p50"], marker="s", label=lab)
        axes[0][j].set_title(b, fontsize=9)
        axes[1][j].set_xlabel("concurrency")
        for ax in (axes[0][j], axes[1][j]):
            ax.set_xscale("log", base=2)
            ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("aggregate output tok/s")
    axes[1][0].set_ylabel("per-request decode tok/s (p50)")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def latency_vs_concurrency(summary: pd.DataFrame, labels: dict[str, str] | None = None,
                           title: str = "Latency vs concurrency") -> plt.Figure:
    """TTFT p50/p95 and E2E p95 against concurrency, one panel per bucket."""
    buckets = list(dict.fromkeys(summary["bucket"]))
    fig, axes = plt.subplots(1, len(buckets), figsize=(3.6 * len(buckets), 3.6), squeeze=False)
    for j, b in enumerate(buckets):
        ax = axes[0][j]
        s = summary[summary["bucket"] == b]
        for cfg in _configs(s):
            d = s[s["config"] == cfg].sort_values("concurrency")
            lab = (labels or {}).get(cfg, cfg)
            line, = ax.plot(d["concurrency"], d["ttft_p50_s"], marker="o", label=f"{lab} TTFT p50")
            ax.plot(d["concurrency"], d["ttft_p95_s"], ls="--", color=line.get_color(), label=f"{lab} TTFT p95")
            ax.plot(d["concurrency"], d["e2e_p95_s"], ls=":", color=line.get_color(), label=f"{lab} E2E p95")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(b, fontsize=9)
        ax.set_xlabel("concurrency")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("seconds")
    axes[0][0].legend(fontsize=6)
    fig.suptitle(title)
    fig.tight_layout()
    return fig
