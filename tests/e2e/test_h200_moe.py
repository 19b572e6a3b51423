"""The MoE study's servers as they answered on the H200 (tests/fixtures/h200-moe: /metrics,
/get_server_info; reports/h200-moe/data: engine logs, checks): what servelab parses from them and
the model facts it predicts with must agree with what the engines themselves reported."""

from __future__ import annotations

import json
import re

import pytest

from servelab.engines import parse_metrics
from servelab.models.facts import facts_from_config, kv_bytes_per_token
from servelab.models.presets import PRESETS
from servelab.report import load_study_data
from servelab.report.checks import compare_quality, quality_of, speculative_rows

from paths import ROOT  # noqa: E402
FIX = ROOT / "tests" / "fixtures" / "h200-moe"
DATA = ROOT / "reports" / "h200-moe" / "data"
GIB = 1 << 30
KV_BYTES = 8 * GIB  # params/h200-moe.yaml: every MoE server's kv-cache-memory-bytes


def _vllm_sample(cid: str, name: str = "metrics-after.txt"):
    s = parse_metrics((FIX / cid / name).read_text())
    assert s.engine == "vllm"
    return s


def _log(cid: str) -> str:
    return (DATA / cid / "engine.log").read_text(errors="replace")


@pytest.fixture(scope="module")
def moe_facts():
    return facts_from_config(PRESETS["deepseek-v2-lite"])


@pytest.mark.parametrize("cid,dtype", [("vllm-eager", "auto"), ("vllm-cudagraph", "auto"), ("vllm-fp8kv", "fp8"),
                                       ("vllm-mnbt-16384", "fp8")])
def test_vllm_kv_capacity_is_the_mla_bytes_per_token_of_8_gib(cid, dtype, moe_facts):
    s = _vllm_sample(cid)
    per_token = kv_bytes_per_token(moe_facts, dtype)
    assert per_token == 27 * (512 + 64) * (1 if dtype == "fp8" else 2)
    # whole blocks of 64 (FlashMLA) or 16 fit in 8 GiB: within one block of the byte count
    assert s.kv_capacity_tokens <= KV_BYTES // per_token < s.kv_capacity_tokens + s.block_size
    assert f"GPU KV cache size: {s.kv_capacity_tokens:,} tokens" in _log(cid)


def test_vllm_fp8_kv_switches_the_mla_backend():
    """bf16 KV: FA3's MLA kernel; fp8 KV: FlashMLA (FLASH_ATTN_MLA lists no fp8 cache dtype)."""
    for cid in ("vllm-eager", "vllm-cudagraph"):
        assert "Using FLASH_ATTN_MLA attention backend" in _log(cid)
    for cid in ("vllm-fp8kv", "vllm-mnbt-16384"):
        assert "Using FLASHMLA attention backend" in _log(cid)
    info = (FIX / "vllm-fp8kv" / "metrics-after.txt").read_text()
    assert 'cache_dtype="fp8"' in info and 'kv_cache_memory_bytes="8589934592"' in info


def test_vllm_counters_cover_the_run_and_the_batch_budget_is_recorded():
    before, after = _vllm_sample("vllm-cudagraph", "metrics-before.txt"), _vllm_sample("vllm-cudagraph")
    records = [json.loads(x) for x in (DATA / "vllm-cudagraph" / "records.jsonl").read_text().splitlines()]
    ok = [r for r in records if r["ok"]]
    generated = after.generation_tokens_total - before.generation_tokens_total
    # every level of the run (warm-up included) is in the counter: 256 tokens per successful request
    assert generated == pytest.approx(256 * len(ok), rel=0.02)
    assert "max_num_batched_tokens=16384" in _log("vllm-mnbt-16384").replace(" ", "") or \
        "'max_num_batched_tokens': 16384" in _log("vllm-mnbt-16384")


@pytest.mark.parametrize("cid,dtype,tokens", [("sglang-cudagraph", "auto", 276000), ("sglang-fp8kv", "fp8_e4m3", 552000)])
def test_sglang_server_info_holds_the_kv_pool_of_the_same_bytes(cid, dtype, tokens, moe_facts):
    info = json.loads((FIX / cid / "get_server_info.json").read_text())
    assert info["version"] == "0.5.16"
    assert info["attention_backend"] == "fa3" and info["kv_cache_dtype"] == dtype
    assert info["max_total_num_tokens"] == tokens
    per_token = kv_bytes_per_token(moe_facts, "fp8" if dtype.startswith("fp8") else "auto")
    assert tokens * per_token == pytest.approx(KV_BYTES, rel=0.001)
    log = _log(cid)
    assert f"#tokens: {tokens}, KV size: 8.00 GB" in log
    # decode batches ran in CUDA graphs in both configurations
    decode = re.findall(r"Decode batch, .*cuda graph: (True|False)", log)
    assert decode and set(decode) == {"True"}


def test_sglang_fp8_kv_warns_about_missing_scales():
    assert "Using FP8 KV cache but no scaling factors provided" in _log("sglang-fp8kv")
    assert "Using FP8 KV cache but no scaling factors provided" not in _log("sglang-cudagraph")


def test_ngram_acceptance_counters_match_the_checks():
    """The per-set deltas of speculative.jsonl add up to no more than the server's own totals
    (warm-ups between the sets count only there), and copy-heavy text is accepted more often."""
    before, after = _vllm_sample("smol-ngram", "metrics-before.txt"), _vllm_sample("smol-ngram")
    rows = [json.loads(x) for x in (DATA / "smol-ngram" / "speculative.jsonl").read_text().splitlines()]
    acc = sum(r["counters"]["vllm:spec_decode_num_accepted_tokens_total"] for r in rows)
    drafted = sum(r["counters"]["vllm:spec_decode_num_draft_tokens_total"] for r in rows)
    assert 0 < acc <= after.spec_accepted_tokens_total - (before.spec_accepted_tokens_total or 0)
    assert drafted <= after.spec_draft_tokens_total - (before.spec_draft_tokens_total or 0)
    sd = load_study_data(ROOT / "reports" / "h200-moe")
    df = speculative_rows(sd).set_index(["set", "concurrency"])
    assert df.loc[("rewrite", 1), "acceptance"] > 2 * df.loc[("questions", 1), "acceptance"]
    # greedy text is the same with and without drafts: the same number of output tokens
    base = {(r["set"], r["concurrency"]): r for r in map(json.loads, (DATA / "smol-bf16" / "speculative.jsonl")
                                                         .read_text().splitlines())}
    assert all(base[(r["set"], r["concurrency"])]["output_tokens"] == r["output_tokens"] for r in rows)


def test_fp8_kv_quality_check_on_real_weights():
    sd = load_study_data(ROOT / "reports" / "h200-moe")
    run, base = quality_of(sd, "smol-fp8kv"), quality_of(sd, "smol-bf16")
    cmp = compare_quality(run, base)
    assert cmp["total"] == len(base["prompts"]) == 28  # 16 quality prompts + 3 of each of the 4 other sets
    assert all(p["output_token_ids"] for p in run["prompts"])  # vLLM returned the token ids
    assert 0 < cmp["identical"] < cmp["total"]  # fp8 KV changed some greedy outputs, not all
    same = [p["id"] for p in run["prompts"] if p["id"] not in {d["id"] for d in cmp["first_divergence"]}]
    by_id = {p["id"]: p for p in base["prompts"]}
    assert all(by_id[i]["output_text"] == next(p for p in run["prompts"] if p["id"] == i)["output_text"] for i in same)


@pytest.mark.parametrize("cid", ["vllm-fp8kv", "sglang-fp8kv"])
def test_unique_cache_salts_hit_no_prefix_cache_and_the_peer_tools_a_little(cid):
    """servelab sends a unique cache_salt per request, the peer tools none: between the run's
    /metrics reads no prompt token came from the prefix cache; between the peers' about 1 %."""
    def counters(name: str) -> tuple[float, float]:
        s = parse_metrics((FIX / cid / name).read_text())
        if s.engine == "vllm":
            return s.prefix_cache_queries_total, s.prefix_cache_hits_total
        text = (FIX / cid / name).read_text()
        found = {k: re.search(rf"^sglang:{k}(?:{{[^}}]*}})? (\S+)$", text, re.M)
                 for k in ("prompt_tokens_total", "cached_tokens_total")}
        val = {k: float(m.group(1)) if m else 0.0 for k, m in found.items()}  # a counter appears at its first count
        return val["prompt_tokens_total"], val["cached_tokens_total"]

    (q0, h0), (q1, h1), (q2, h2) = (counters(n) for n in ("metrics-before.txt", "metrics-after.txt",
                                                        "metrics-after-peers.txt"))
    assert h1 - h0 <= 1 and q1 - q0 > 500_000  # the run: 2 buckets x 3 levels, no hits
    assert 0.002 < (h2 - h1) / (q2 - q1) < 0.05  # the peers: the chat template's first tokens, now and then
