"""Prefill: TTFT against prompt length at concurrency 1, fitted per configuration
(`TTFT = overhead_s + prompt_tokens / prefill_tps`) from the measured requests."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from .stats import ordered_unique, fit_ttft


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
    for cfg in ordered_unique(data["config"]):
        d = data[(data["config"] == cfg) & (data["concurrency"] == concurrency)]
        if is_records:
            d = d[d["ok"].astype(bool) & ~d["warmup"].astype(bool)]
            if "shared_prefix" in d.columns:
                d = d[~d["shared_prefix"].fillna(False).astype(bool)]
            x, y = d["prompt_tokens"], d["ttft_s"]
            per_len = d.groupby(_length_key(d)).agg(p=("prompt_tokens", "median"), t=("ttft_s", "median"))
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


def _length_key(d: pd.DataFrame) -> pd.Series:
    """What makes one prompt length: the bucket's target input tokens; a bucket whose lengths
    come with its prompts (a prompt set or a trace: target 0) is a length of its own, by name."""
    if "target_input_tokens" not in d.columns:
        return d["prompt_tokens"]
    target = pd.to_numeric(d["target_input_tokens"], errors="coerce").fillna(0)
    if "bucket" not in d.columns or (target > 0).all():
        return target
    return ("in:" + target.astype(int).astype(str)).where(target > 0, "bucket:" + d["bucket"].astype(str))
