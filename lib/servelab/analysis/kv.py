"""KV-cache residency: capacity predicted from model facts against the server's own figure,
per-level pressure (usage, waiting, preemptions) and the verdict "does KV limit
concurrency?", plus the time-series figure. Pure functions of files already on disk."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from ..engines.flags import engine_args as args_of, get_flag
from ..models.facts import kv_bytes_per_token
from .phrase import Clauses, Phrase, sentences
from .stats import pct_change, to_float

if TYPE_CHECKING:
    import matplotlib.pyplot as plt


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


def kv_block(args: Mapping[str, Any]) -> int:
    """Tokens per KV-cache block (vLLM's block-size, SGLang's page-size; 16 by default)."""
    return int(get_flag(args, "block-size") or get_flag(args, "page-size") or 16)


def flag_kv_tokens(args: Mapping[str, Any], bytes_per_token: float) -> tuple[float, str] | None:
    """KV-cache tokens fixed by the flags, with the flag's name: forced blocks (num-gpu-blocks-override
    times the block or page size) or a byte budget (kv-cache-memory-bytes, whole blocks); None when
    the pool is sized from the memory left after the weights."""
    block = kv_block(args)
    blocks = get_flag(args, "num-gpu-blocks-override")
    if blocks:
        return float(int(blocks) * block), "num-gpu-blocks-override"
    mem = get_flag(args, "kv-cache-memory-bytes")
    if mem is not None:
        return float(parse_size_bytes(mem) // (bytes_per_token * block) * block), "kv-cache-memory-bytes"
    return None


def kv_capacity_check(facts: Mapping[str, Any], kv_memory_bytes: Any, server_capacity_tokens: float | None,
                      block_size: int | None = None, kv_dtype: str = "auto",
                      tensor_parallel_size: int = 1) -> dict[str, Any]:
    """Model-facts prediction of KV capacity (tokens) against the server's own figure.

    ``predicted_capacity_tokens = kv_capacity(kv_memory_bytes, kv_bytes_per_token(...),
    block_size)`` where ``kv_memory_bytes`` is the per-GPU KV budget (e.g. vLLM's
    ``--kv-cache-memory-bytes``, parsed by :func:`parse_size_bytes`), compared with
    ``server_capacity_tokens`` (vLLM ``num_gpu_blocks x block_size``; SGLang
    ``max_total_num_tokens``). Returns both, ``diff_pct`` (server vs prediction) and a
    `Phrase` saying so.
    """
    mem = parse_size_bytes(kv_memory_bytes)
    bpt = kv_bytes_per_token(facts, kv_dtype, tensor_parallel_size)
    pred = kv_capacity(mem, bpt, block_size)
    server = to_float(server_capacity_tokens)
    diff = pct_change(server, pred)
    budget = {"predicted": pred, "memory_bytes": mem, "bytes_per_token": bpt,
              "blocks": Phrase("capacity.in_blocks", {"block_size": block_size}) if block_size else ""}
    if math.isfinite(server):
        phrase = Phrase("capacity.compared", {**budget, "server": int(server), "diff_pct": diff,
                                              "verdict": Phrase("capacity.agrees" if abs(diff) < 1.0 else
                                                                "capacity.differs")})
    else:
        phrase = Phrase("capacity.not_reported", budget)
    return {"kv_memory_bytes": mem, "kv_bytes_per_token": bpt, "predicted_capacity_tokens": pred,
            "server_capacity_tokens": server, "diff_pct": diff, "phrase": phrase}


def _metrics_available(samples: pd.DataFrame | None) -> tuple[bool, Phrase | None]:
    """(usable, why not): the samples carry a KV-usage gauge, else the `Phrase` saying why not."""
    if samples is None:
        return False, Phrase("metrics.no_file")
    if samples.attrs.get("available") is False:
        reason = samples.attrs.get("reason")
        return False, Phrase("note", {"note": str(reason)}) if reason else Phrase("metrics.no_endpoint")
    if samples.empty:
        return False, Phrase("metrics.no_samples")
    if "kv_usage_frac" not in samples.columns or samples["kv_usage_frac"].notna().sum() == 0:
        return False, Phrase("metrics.no_kv_gauge")
    return True, None


def counter_increase(values: Sequence[float]) -> float:
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
    """KV-cache pressure per load level from :func:`servelab.runfolder.load_samples`.

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
        inc = counter_increase(pre.iloc[max(0, a - 1):b + 1].tolist())
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


def _capacity(samples: pd.DataFrame, ok: bool, facts: Mapping[str, Any], mem: Any, args: Mapping[str, Any],
              kv_dtype: str | None, tensor_parallel_size: int | None) -> dict[str, Any]:
    """:func:`kv_capacity_check` with the server's capacity and block size from the samples (else
    the args); a forced block count (``num-gpu-blocks-override``) replaces the budget's prediction."""
    server_cap = math.nan
    if ok and "kv_capacity_tokens" in samples.columns and samples["kv_capacity_tokens"].notna().any():
        server_cap = float(samples["kv_capacity_tokens"].dropna().iloc[-1])
    block = None
    if ok and "block_size" in samples.columns and samples["block_size"].notna().any():
        block = int(samples["block_size"].dropna().iloc[-1])
    elif get_flag(args, "block-size"):
        block = int(get_flag(args, "block-size"))
    cap = kv_capacity_check(
        facts, mem, server_cap, block_size=block,
        kv_dtype=kv_dtype or get_flag(args, "kv-cache-dtype") or "auto",
        tensor_parallel_size=tensor_parallel_size or int(get_flag(args, "tensor-parallel-size") or 1))
    override = get_flag(args, "num-gpu-blocks-override")
    if override and block:  # the block count was forced: that, not the memory budget, sets capacity
        forced = int(override) * block
        cap["predicted_capacity_tokens"] = forced
        cap["diff_pct"] = pct_change(server_cap, forced)
        if math.isfinite(server_cap):
            cap["phrase"] = Phrase("capacity.forced", {
                "blocks": int(override), "block_size": block, "forced": forced, "budget_bytes": cap["kv_memory_bytes"],
                "budget_tokens": kv_capacity(cap["kv_memory_bytes"], cap["kv_bytes_per_token"], block),
                "server": int(server_cap),
                "verdict": Phrase("capacity.agrees" if abs(cap["diff_pct"]) < 1.0 else "capacity.differs")})
        else:
            cap["phrase"] = Phrase("capacity.forced_not_reported", {"forced": forced})
    return cap


def _limited_phrase(wait: pd.Series, crowded: pd.Series, pre: float, retr_max: float, kv_max: float,
                    threshold: float, levels: list[str]) -> Phrase:
    parts = Clauses(x for x in (
        Phrase("kv.crowded", {"waiting": int(wait[crowded].max()), "threshold": threshold, "peak": kv_max})
        if crowded.any() else None,
        Phrase("kv.preempted", {"n": pre}) if math.isfinite(pre) and pre > 0 else None,
        Phrase("kv.retracted", {"n": retr_max}) if math.isfinite(retr_max) and retr_max > 0 else None) if x)
    if levels:
        return Phrase("kv.limited_at", {"levels": ", ".join(levels), "parts": parts})
    return Phrase("kv.limited", {"parts": parts})


def _not_limited_phrases(wait: pd.Series, pre: float, kv_max: float, threshold: float,
                         peak_level: str | None) -> list[Phrase]:
    out = [Phrase("kv.not_limited", {
        "peak": kv_max, "threshold": threshold,
        "at": Phrase("kv.peak_at", {"level": peak_level}) if peak_level else "",
        "preemptions": Phrase("kv.preemptions", {"n": pre}) if math.isfinite(pre) else
        Phrase("kv.preemptions_not_exposed")})]
    if wait.max() > 0:
        out.append(Phrase("kv.scheduler_queue", {"waiting": int(wait.max()), "threshold": threshold}))
    return out


def kv_verdict(samples: pd.DataFrame, kv_threshold_frac: float = 0.9, facts: Mapping[str, Any] | None = None,
               kv_memory_bytes: Any = None, engine_args: Mapping[str, Any] | None = None,
               kv_dtype: str | None = None, tensor_parallel_size: int | None = None) -> dict[str, Any]:
    """Does the KV cache limit concurrency in this run? One dict with the numbers.

    Rule: ``limited`` is True when some sample shows requests waiting (``waiting > 0``)
    while KV usage is >= ``kv_threshold_frac`` (90 %), or the preemption counter (vLLM
    ``num_preemptions``, SGLang ``num_retracted_requests``) increased, or SGLang's
    retraction gauge was ever > 0. Otherwise "not limited" -- including when /metrics was
    unavailable, which the evidence says (``assessed`` False).

    With ``facts`` and a KV budget (``kv_memory_bytes``, or ``kv-cache-memory-bytes`` in
    ``engine_args`` = run.json ``engine_params`` or its ``args``), the prediction from
    model facts is compared with the server's ``kv_capacity_tokens``
    (:func:`kv_capacity_check`; ``kv-cache-dtype``, ``tensor-parallel-size`` and
    ``block-size`` are read from the args unless given).

    Keys: limited, assessed, evidence (`Sentences` of `Phrase`s for the report to word),
    kv_usage_max_frac, waiting_max, running_max, preemptions_delta, levels_limited, residency
    (the :func:`kv_residency` frame) and, when compared, capacity (the :func:`kv_capacity_check` dict).
    """
    args = args_of(engine_args)
    out: dict[str, Any] = {"limited": False, "assessed": False, "evidence": sentences(),
                           "kv_usage_max_frac": math.nan, "waiting_max": math.nan, "running_max": math.nan,
                           "preemptions_delta": math.nan, "levels_limited": [], "residency": pd.DataFrame()}
    ok, why = _metrics_available(samples)
    mem = kv_memory_bytes if kv_memory_bytes is not None else get_flag(args, "kv-cache-memory-bytes")
    cap_phrase = None
    if facts is not None and mem is not None:
        out["capacity"] = _capacity(samples, ok, facts, mem, args, kv_dtype, tensor_parallel_size)
        cap_phrase = out["capacity"]["phrase"]
    if not ok:
        out["evidence"] = sentences(Phrase("kv.unavailable", {"why": why}), cap_phrase)
        return out
    res = kv_residency(samples, kv_threshold_frac)
    s = samples.sort_values("t_s", kind="stable")
    kv = s["kv_usage_frac"].astype(float)
    wait = s["waiting"].astype(float)
    crowded = (wait > 0) & (kv >= kv_threshold_frac)
    pre = counter_increase(s["preemptions_total"].tolist()) if "preemptions_total" in s.columns else math.nan
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
    if limited:
        said = [_limited_phrase(wait, crowded, pre, retr_max, kv_max, kv_threshold_frac, limited_levels)]
    else:
        said = _not_limited_phrases(wait, pre, kv_max, kv_threshold_frac, peak_level)
    out["evidence"] = sentences(*said, cap_phrase)
    return out


def kv_timeseries(samples: pd.DataFrame, title: str = "KV cache and scheduler over time") -> plt.Figure:
    """KV usage %, running and waiting requests and cumulative preemptions against
    sampler time, with a dotted line and a label at the start of every load level.
    Without samples the figure says so instead of plotting."""
    import matplotlib.pyplot as plt  # here: pyplot takes 0.3 s to import, and only this figure needs it

    fig, axes = plt.subplots(3, 1, figsize=(8, 6.4), sharex=True)
    ok, why = _metrics_available(samples)
    if not ok:
        for ax in axes:
            ax.set_axis_off()
        axes[1].text(0.5, 0.5, f"no /metrics samples ({why.key})", ha="center", va="center",
                     transform=axes[1].transAxes)
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
