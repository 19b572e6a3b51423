"""Speculative decoding: acceptance from the server's counters, the A/B against the
configuration without speculation, and CUDA-graph capture-size warnings (with
MTP=1, 4 concurrent requests need a capture size of 8)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd

from ..engines.flags import engine_args as args_of, get_flag, json_value
from ..engines.vllm import derive_capture_sizes
from ..summary import SPEC_COLUMNS, spec_rates
from .kv import counter_increase
from .stats import to_float, ordered_unique, pct_change


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
    slice for one level) or a :func:`servelab.measure.metrics.delta` dict of increments.
    """
    out: dict[str, Any] = {"engine": None, "drafts": math.nan, "draft_tokens": math.nan, "accepted_tokens": math.nan,
                           "acceptance_rate": math.nan, "mean_acceptance_length": math.nan, "source": "", "note": ""}
    if isinstance(samples_or_delta, pd.DataFrame):
        drafts, dtok, acc, gauge, out["engine"] = _from_samples(samples_or_delta)
    else:
        d = samples_or_delta
        drafts, dtok, acc = (to_float(d.get("spec_drafts_total")), to_float(d.get("spec_draft_tokens_total")),
                             to_float(d.get("spec_accepted_tokens_total")))
        gauge = to_float(d.get("spec_accept_length"))
        out["engine"] = d.get("engine")
    k = num_speculative_tokens
    if not math.isfinite(drafts) and math.isfinite(dtok) and k:
        drafts = dtok / k  # every draft proposes k tokens
    out.update(drafts=drafts, draft_tokens=dtok, accepted_tokens=acc)
    if math.isfinite(dtok) and dtok > 0 and math.isfinite(acc):
        r = spec_rates({"spec_drafts_total": drafts, "spec_draft_tokens_total": dtok,
                        "spec_accepted_tokens_total": acc})  # the one place of the counter arithmetic
        out["acceptance_rate"] = r["spec_acceptance_rate"]
        if math.isfinite(r["spec_mean_accepted_len"]):
            out["mean_acceptance_length"] = r["spec_mean_accepted_len"]
        out["source"] = "vLLM counters: accepted/draft tokens; 1 + accepted/drafts (vllm/v1/spec_decode/metrics.py)"
    elif math.isfinite(gauge):
        out["mean_acceptance_length"] = gauge
        if k:
            out["acceptance_rate"] = (gauge - 1.0) / k
        out["source"] = "SGLang gauge spec_accept_length (mean over samples with running requests)"
    else:
        out["note"] = "no speculative-decoding metrics (speculation off, or the engine does not expose them)"
    return out


def _from_samples(s: pd.DataFrame) -> tuple[float, float, float, float, str | None]:
    """(drafts, draft tokens, accepted tokens, SGLang's mean accept-length gauge, engine) of a samples
    frame: counters differenced from its first to its last row, the gauge over rows with requests running."""
    if "t_s" in s.columns:
        s = s.sort_values("t_s", kind="stable")

    def inc(col: str) -> float:
        return counter_increase(s[col].tolist()) if col in s.columns else math.nan

    drafts, dtok, acc = inc("spec_drafts_total"), inc("spec_draft_tokens_total"), inc("spec_accepted_tokens_total")
    gauge = math.nan
    if "spec_accept_length" in s.columns:
        g = s
        if "running" in s.columns:
            g = s[s["running"].astype(float) > 0]
        vals = g["spec_accept_length"].astype(float).dropna()
        vals = vals[vals > 0]
        gauge = float(vals.mean()) if len(vals) else math.nan
    engine = str(s["engine"].dropna().iloc[-1]) if "engine" in s.columns and s["engine"].notna().any() else None
    return drafts, dtok, acc, gauge, engine


def spec_levels(summary: pd.DataFrame) -> pd.DataFrame:
    """The levels that speculated, with their acceptance figures from the engine's counters over
    the measured rounds (summary columns `SPEC_COLUMNS`, `summary.spec_rates`): configuration,
    bucket, prompt set, concurrency, acceptance rate, mean accepted length per step (bonus token
    included), draft tokens per second and acceptance by draft position."""
    if summary is None or summary.empty or "spec_acceptance_rate" not in summary:
        return pd.DataFrame(columns=["config", "bucket", "prompt_set", "concurrency", *SPEC_COLUMNS])
    keys = [k for k in ("config", "bucket", "prompt_set", "concurrency") if k in summary]
    s = summary[summary["spec_acceptance_rate"].notna()]
    return s[keys + list(SPEC_COLUMNS)].reset_index(drop=True)


def _single_config(summary: pd.DataFrame, what: str) -> pd.DataFrame:
    cfgs = ordered_unique(summary["config"])
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
        m[f"{col}_change_pct"] = [pct_change(s, b) for s, b in zip(m[f"{col}_spec"], m[f"{col}_base"])]
    m.insert(0, "config_spec", summary_spec["config"].iloc[0])
    m.insert(0, "config_base", summary_base["config"].iloc[0])
    return m.sort_values(["bucket", "concurrency"], kind="stable").reset_index(drop=True)


def capture_size_warnings(engine_args: Mapping[str, Any], concurrency_levels: Iterable[int]) -> list[str]:
    """Warn when a decode step of some load level will not run on a captured CUDA graph.

    ``engine_args`` is run.json ``engine_params`` or its ``args`` (flags as given to
    ``vllm serve``; JSON strings are parsed). With ``speculative-config`` carrying
    ``num_speculative_tokens`` k (0 without speculation), each request adds ``1 + k``
    tokens to a decode step, so concurrency ``c`` needs a graph of ``c * (1 + k)``.
    Only explicit ``compilation-config`` ``cudagraph_capture_sizes`` (or
    ``max_cudagraph_capture_size``) are checked -- vLLM's defaults reach far higher --
    and nothing is checked under ``enforce-eager`` or ``cudagraph_mode: NONE``.

    * Above the largest capture size, vLLM runs the step without a CUDA graph, much slower
      (with MTP=1, 4 requests x 2 tokens need size 8). One warning per such concurrency.
    * Between capture sizes, vLLM pads the batch up to the next captured size (wasted
      slots); also reported. (Newer vLLM rounds sizes for FULL decode graphs up to
      multiples of 1 + k: vllm/config/compilation.py, adjust_cudagraph_sizes_for_spec_decode.)
    """
    args = args_of(engine_args)
    if get_flag(args, "enforce-eager") is True:
        return []
    comp = json_value(get_flag(args, "compilation-config")) or {}
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
    spec = json_value(get_flag(args, "speculative-config")) or {}
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
