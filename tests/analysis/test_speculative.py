"""Speculative-decoding figures from a real vLLM CPU server's /metrics (SmolLM2-135M, n-gram
speculation with 4 draft tokens, eager; two scrapes around three rewrite-set requests):
engines' mapping -> measure.metrics.delta -> summary.spec_rates, checked against the counter
arithmetic done here directly on the text."""

from __future__ import annotations

import math
import re

import pandas as pd

from servelab.analysis.speculative import spec_levels, spec_stats
from servelab.engines import parse_metrics
from servelab.measure.metrics import delta
from servelab.summary import summarize, spec_rates
from paths import FIXTURES

FIX = FIXTURES / "vllm-cpu-ngram"
BEFORE = (FIX / "metrics_before.txt").read_text()
AFTER = (FIX / "metrics_after.txt").read_text()


def _total(text: str, name: str, position: int | None = None) -> float:
    """Sum of a counter's samples (optionally one draft position) straight from the text."""
    pat = re.compile(rf"^{re.escape(name)}\{{([^}}]*)\}} (\S+)$", re.M)
    out = 0.0
    for labels, v in pat.findall(text):
        if position is None or f'position="{position}"' in labels:
            out += float(v)
    return out


def _inc(name: str, position: int | None = None) -> float:
    return _total(AFTER, name, position) - _total(BEFORE, name, position)


def test_figures_equal_the_counter_arithmetic():
    d = delta(parse_metrics(BEFORE), parse_metrics(AFTER))
    acc, dtok = _inc("vllm:spec_decode_num_accepted_tokens_total"), _inc("vllm:spec_decode_num_draft_tokens_total")
    drafts = _inc("vllm:spec_decode_num_drafts_total")
    assert drafts > 0 and dtok == 4 * drafts  # every n-gram draft that is proposed has 4 tokens here
    r = spec_rates(d, seconds=2.0)
    assert r["spec_acceptance_rate"] == acc / dtok
    assert r["spec_mean_accepted_len"] == 1 + acc / drafts
    assert r["spec_draft_tokens_per_s"] == dtok / 2.0
    per_pos = [_inc("vllm:spec_decode_num_accepted_tokens_per_pos_total", i) / drafts for i in range(4)]
    assert r["spec_accepted_per_position"] == per_pos
    assert sum(per_pos) * drafts == acc  # the positions add up to the accepted tokens
    assert per_pos == sorted(per_pos, reverse=True)  # a later position is accepted only after the earlier ones
    s = spec_stats(d, 4)
    assert s["acceptance_rate"] == r["spec_acceptance_rate"] and s["mean_acceptance_length"] == r["spec_mean_accepted_len"]


def test_level_rows_carry_the_figures():
    d = delta(parse_metrics(BEFORE), parse_metrics(AFTER))
    rec = {"config": "ngram", "bucket": "rewrite-out128", "target_input_tokens": 0, "target_output_tokens": 128,
           "concurrency": 1, "rate_rps": 0.0, "prompt_set": "rewrite", "round": 0, "warmup": False, "ok": True,
           "level": 0, "start_s": 0.0, "end_s": 4.0, "output_tokens": 100, "prompt_tokens": 130, "ttft_s": 0.1,
           "e2e_s": 4.0, "e2e_output_tps": 25.0, "decode_tps": 25.4, "tpot_s": 0.04, "chunk_times_s": [],
           "error_kind": None}
    other = {**rec, "config": "eager", "level": 0}
    levels = [{"config": "ngram", "level": 0, "measured_s": 4.0, "counters": d},
              {"config": "eager", "level": 0, "measured_s": 4.0, "counters": {**d, "spec_drafts_total": None,
                                                                              "spec_draft_tokens_total": None}}]
    s = summarize(pd.DataFrame([rec, other]), levels)
    ng = s[s["config"] == "ngram"].iloc[0]
    assert ng["spec_acceptance_rate"] == _inc("vllm:spec_decode_num_accepted_tokens_total") / \
        _inc("vllm:spec_decode_num_draft_tokens_total")
    assert ng["spec_draft_tokens_per_s"] == _inc("vllm:spec_decode_num_draft_tokens_total") / 4.0
    eg = s[s["config"] == "eager"].iloc[0]
    assert math.isnan(eg["spec_acceptance_rate"]) and eg["spec_accepted_per_position"] is None
    assert list(spec_levels(s)["config"]) == ["ngram"]
