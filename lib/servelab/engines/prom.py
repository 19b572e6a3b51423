"""Engine-neutral view of a Prometheus `/metrics` text: `ServerSample` and the parsing
helpers the engine profiles use to fill it (each profile maps its own metric names:
`engines/vllm.py`, `engines/sglang.py`). Not for sampling during a run (`measure.metrics`).

Aggregation across label sets: counters and count gauges (running, waiting, capacities) are
summed over label sets (several engines, models or DP ranks); fractions/averages
(`kv_usage_frac`, `cache_hit_rate`, `spec_accept_length`) are averaged. SGLang series that
differ only in `tp_rank` are mirrors of one scheduler and are counted once (lowest rank).
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families


@dataclass
class ServerSample:
    """One scrape of a server's ``/metrics`` mapped to an engine-neutral schema.

    Every field except ``engine`` is None when the engine (or its version/flags)
    does not expose it. Fields ending in ``_total`` and histogram ``*_sum_s`` /
    ``*_count`` fields are cumulative since server start; the rest are point-in-time.
    """

    engine: str = "unknown"  # "vllm" | "sglang" | "unknown"
    # KV cache
    kv_usage_frac: float | None = None  # 0..1, mean over engines/ranks
    kv_capacity_tokens: int | None = None  # total KV slots in tokens over engines
    num_gpu_blocks: int | None = None  # vLLM, per engine (cache_config_info label)
    block_size: int | None = None  # vLLM, tokens per KV block
    # scheduler
    running: int | None = None  # requests in the running batch
    waiting: int | None = None  # requests queued
    preemptions_total: float | None = None  # vLLM preemptions / SGLang retractions (counter)
    retracted_reqs: int | None = None  # SGLang gauge: retractions in the last log interval
    # prefix cache (vLLM: tokens queried/hit; SGLang: cached prompt tokens)
    prefix_cache_queries_total: float | None = None
    prefix_cache_hits_total: float | None = None
    cache_hit_rate: float | None = None  # SGLang gauge, 0..1, last batch
    # speculative decoding
    spec_drafts_total: float | None = None  # vLLM
    spec_draft_tokens_total: float | None = None  # vLLM
    spec_accepted_tokens_total: float | None = None  # vLLM
    spec_accept_length: float | None = None  # SGLang gauge, tokens per verify step
    spec_accepted_per_pos_total: list[float] | None = None  # vLLM, accepted drafts by draft position 0..k-1
    # throughput counters
    prompt_tokens_total: float | None = None
    generation_tokens_total: float | None = None
    # histogram sums (seconds) and counts (observations)
    ttft_sum_s: float | None = None
    ttft_count: float | None = None
    itl_sum_s: float | None = None
    itl_count: float | None = None
    prefill_sum_s: float | None = None
    prefill_count: float | None = None
    queue_sum_s: float | None = None
    queue_count: float | None = None
    e2e_sum_s: float | None = None
    e2e_count: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

SAMPLE_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(ServerSample))

# Fields that are not one number (a sample frame keeps them as objects).
LIST_FIELDS: tuple[str, ...] = ("spec_accepted_per_pos_total",)

# Cumulative fields that delta() differences.
COUNTER_FIELDS: tuple[str, ...] = (
    "prefix_cache_queries_total",
    "prefix_cache_hits_total",
    "preemptions_total",
    "prompt_tokens_total",
    "generation_tokens_total",
    "spec_drafts_total",
    "spec_draft_tokens_total",
    "spec_accepted_tokens_total",
    "ttft_sum_s",
    "ttft_count",
    "itl_sum_s",
    "itl_count",
    "prefill_sum_s",
    "prefill_count",
    "queue_sum_s",
    "queue_count",
    "e2e_sum_s",
    "e2e_count",
)

Series = list[tuple[dict[str, str], float]]


def index_metrics(text: str) -> dict[str, Series]:
    """Sample name -> [(labels, value)], across all families.

    Indexing by *sample* name sidesteps the parser's family renaming (a counter
    family ``x`` has samples ``x_total``/``x_created``; a histogram ``h`` has
    ``h_bucket``/``h_sum``/``h_count``). NaN values are dropped.
    """
    out: dict[str, Series] = defaultdict(list)
    # Histogram buckets are most of the lines and nothing here reads them (only _sum/_count):
    # dropping them before the pure-Python parser cuts its CPU per scrape several-fold, CPU the
    # sampler would otherwise take from the client and, on a small machine, from the server.
    text = "\n".join(ln for ln in text.split("\n") if "_bucket{" not in ln)
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            v = float(s.value)
            if math.isnan(v):
                continue
            out[s.name].append((dict(s.labels), v))
    return out


def first_series(idx: Mapping[str, Series], names: Iterable[str]) -> Series | None:
    """Series of the first name present (preference order, never summed across names)."""
    for n in names:
        series = idx.get(n)
        if series:
            return series
    return None


def counter_names(base: str) -> tuple[str, str]:
    # Typed counters always parse to `<base>_total`; an untyped bare `<base>` line
    # (no TYPE comment) keeps its literal name.
    return (f"{base}_total", base)


def dedup_tp(series: Series) -> Series:
    """Keep one series per label set ignoring ``tp_rank`` (SGLang TP mirrors)."""
    best: dict[tuple[tuple[str, str], ...], tuple[int, dict[str, str], float]] = {}
    for labels, v in series:
        key = tuple(sorted((k, val) for k, val in labels.items() if k != "tp_rank"))
        try:
            rank = int(labels.get("tp_rank", "0"))
        except ValueError:
            rank = 0
        if key not in best or rank < best[key][0]:
            best[key] = (rank, labels, v)
    return [(labels, v) for _, labels, v in best.values()]


def sum_of(series: Series | None) -> float | None:
    return None if not series else float(sum(v for _, v in series))


def mean_of(series: Series | None) -> float | None:
    return None if not series else float(sum(v for _, v in series) / len(series))


def to_int(x: float | None) -> int | None:
    return None if x is None else int(round(x))


def label_int(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return int(float(value))
    except ValueError:  # "None" before the KV cache is initialised
        return None


def histogram(idx: Mapping[str, Series], bases: Iterable[str], tp_dedup: bool = False) -> tuple[float | None, float | None]:
    """(sum, count) of the first histogram base name that is present."""
    for base in bases:
        s, c = idx.get(f"{base}_sum"), idx.get(f"{base}_count")
        if s or c:
            if tp_dedup:
                s = dedup_tp(s) if s else s
                c = dedup_tp(c) if c else c
            return sum_of(s), sum_of(c)
    return None, None


def by_label(series: Series | None, label: str) -> list[float] | None:
    """Values summed per integer label value, as a list indexed by it (gaps are 0)."""
    if not series:
        return None
    acc: dict[int, float] = defaultdict(float)
    for labels, v in series:
        i = label_int(labels.get(label))
        if i is not None and i >= 0:
            acc[i] += v
    return [acc.get(i, 0.0) for i in range(max(acc) + 1)] if acc else None
