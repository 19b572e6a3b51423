"""The write-up's verdicts on the committed data: the rules get the records-based prefill fit
and the roofline bound the report shows, so they agree with the tables beside them."""

from __future__ import annotations

import pytest

from servelab.report import diagnosis as dg
from servelab.report import load_study_data
from paths import ROOT



def verdicts(study: str, cid: str) -> dict[str, str]:
    f = dg.symptom_frame(load_study_data(ROOT / "reports" / study), cid)
    return dict(zip(f["rule"], f["present"]))


@pytest.mark.parametrize("cid", ["roomy", "kv-tight"])
def test_local_cpu_ttft_grows_with_prompt_length(cid):
    # TTFT at c=1 grows ~20x from 32- to 2,048-token prompts; the records-based fit is significant
    assert verdicts("local-cpu-kv", cid)["ttft_grows_with_prompt"] == "yes"


def test_kv_tight_is_limited_by_the_kv_cache_and_roomy_is_not():
    assert verdicts("local-cpu-kv", "kv-tight")["kv_eviction"] == "yes"
    assert verdicts("local-cpu-kv", "roomy")["kv_eviction"] == "no"


def test_h200_decode_at_c1_against_the_roofline():
    sd = load_study_data(ROOT / "reports" / "h200-llama8b-vllm")
    e = dg.roofline(sd)
    c1 = e[(e["concurrency"] == 1) & (e["bucket"] == "in256-out256")].set_index("config")["decode_efficiency_pct"]
    assert 55 < c1["cudagraph"] < 70 and c1["eager"] < 25  # 62.6 % vs 18 % of the 4.8 TB/s bound
    assert verdicts("h200-llama8b-vllm", "cudagraph")["slow_decode_at_c1"] == "no"
    assert verdicts("h200-llama8b-vllm", "eager")["slow_decode_at_c1"] == "yes"
    assert verdicts("h200-llama8b-vllm", "eager")["ttft_grows_with_prompt"] == "yes"


def test_symptom_sentences_in_both_languages():
    sd = load_study_data(ROOT / "reports" / "local-cpu-kv")
    en = dg.symptom_text(sd, "kv-tight")
    ja = dg.symptom_text(sd.with_language("ja"), "kv-tight")
    assert "**TTFT grows with prompt length: yes.**" in en and "First check: prefill rate" in en
    assert "**TTFT がプロンプト長とともに増加する：あり。**" in ja and "最初のチェック" in ja
    # the evidence is Japanese too: no English sentence from the analysis on the Japanese page
    assert "TTFT p50 at c=1" in en and "TTFT p50 at c=1" not in ja and "c=1 の TTFT 中央値" in ja
    assert "the server preempted 21 time(s)" in en and "サーバーは 21 回プリエンプションしました" in ja
