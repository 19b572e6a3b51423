"""The SGLang path against RECORDED REAL responses of SGLang 0.5.16 on an H200 (a GPU session of
2026-12-01, study h200-llama8b-sglang; the study runner saved them under
runs/<study>/<config>/recorded/, copied to tests/fixtures/sglang-0.5.16/): `/get_server_info`,
`/tokenize` (a prompt and a chat request), `/metrics` before the run, after it, after SGLang's own
bench_serving on the same server, and after the saturation sweep. Plus the prefix-cache isolation
of servelab's unique cache_salt, read from the committed data of that study."""

from __future__ import annotations

import json

import httpx
import pandas as pd
import pytest
from servelab.engines import engine_of, get, parse_metrics
from servelab.engines.sglang import SglangProfile
from servelab.measure.workload import ServerTokenizer
from paths import ROOT

FIX = ROOT / "tests" / "fixtures" / "sglang-0.5.16"
DATA = ROOT / "reports" / "h200-llama8b-sglang" / "data"
SGLANG_CONFIGS = ["sglang-cudagraph", "sglang-saturation", "sglang-eager", "sglang-seed000"]


def _text(name: str) -> str:
    return (FIX / name).read_text(encoding="utf-8")


def _json(name: str) -> dict:
    return json.loads(_text(name))


def _mock_get(monkeypatch: pytest.MonkeyPatch, answers: dict[str, tuple[int, str]]) -> list[str]:
    """httpx.get answering recorded bodies by path (404 otherwise); returns the paths asked."""
    asked: list[str] = []

    def fake_get(url: str, **kw: object) -> httpx.Response:
        path = "/" + url.split("://", 1)[1].split("/", 1)[1]
        asked.append(path)
        code, body = answers.get(path, (404, '{"detail":"Not Found"}'))
        return httpx.Response(code, text=body, request=httpx.Request("GET", url))

    monkeypatch.setattr(httpx, "get", fake_get)
    return asked


# -- /get_server_info --------------------------------------------------------------------------

def test_server_info_and_version_from_recorded_get_server_info(monkeypatch):
    asked = _mock_get(monkeypatch, {"/get_server_info": (200, _text("get_server_info.json"))})
    prof = get("sglang")
    assert isinstance(prof, SglangProfile)
    facts = prof.server_info("http://127.0.0.1:30000")
    assert asked == ["/get_server_info"]
    assert facts["path"] == "/get_server_info"
    assert prof.version(facts) == "0.5.16"
    assert facts["max_total_num_tokens"] == 857409
    assert facts["attention_backend"] == "fa3"
    assert facts["context_length"] == 16384 and facts["mem_fraction_static"] == 0.85 and facts["tp_size"] == 1
    assert facts["chunked_prefill_size"] == 8192 and facts["max_req_input_len"] == 16378
    dec, pre = facts["cuda_graph_config"]["decode"], facts["cuda_graph_config"]["prefill"]
    # SGLang 0.5.16's defaults on an H200 at TP 1: decode graph full up to bs 256, prefill breakable
    assert (dec["backend"], dec["max_bs"], dec["bs"][:4], dec["bs"][-1], len(dec["bs"])) == ("full", 256, [1, 2, 4, 8], 256, 36)
    assert (pre["backend"], pre["max_bs"]) == ("breakable", 8192)
    assert facts["disable_cuda_graph"] is False and facts["enable_metrics"] is True


def test_server_info_falls_back_to_server_info_path(monkeypatch):
    asked = _mock_get(monkeypatch, {"/server_info": (200, _text("get_server_info.json"))})
    facts = SglangProfile().server_info("http://127.0.0.1:30000")
    assert asked == ["/get_server_info", "/server_info"]
    assert facts["path"] == "/server_info" and SglangProfile().version(facts) == "0.5.16"


@pytest.mark.parametrize("name, decode, bs, prefill", [
    ("get_server_info-eager.json", "disabled", None, "disabled"),        # backends decode/prefill disabled
    ("get_server_info-seed000.json", "full", [1, 2, 4], "disabled"),    # seed 000's flags, max bs 4
])
def test_cuda_graph_settings_as_the_server_reports_them(name, decode, bs, prefill):
    facts = _json(name)
    cfg = facts["cuda_graph_config"]
    assert cfg["decode"]["backend"] == decode and cfg["prefill"]["backend"] == prefill
    if bs is not None:
        assert cfg["decode"]["bs"] == bs and cfg["decode"]["max_bs"] == 4
    # the deprecated flag stays False: the explicit backends are what 0.5.16 reads
    assert facts["disable_cuda_graph"] is False and facts["version"] == "0.5.16"
    assert facts["max_total_num_tokens"] == 857409


def test_profile_describes_the_configurations_as_the_server_ran_them():
    prof = SglangProfile()
    assert prof.describe({"cuda-graph-backend-decode": "disabled", "cuda-graph-backend-prefill": "disabled"})["cuda_graph"] == "eager"
    d = prof.describe({"cuda-graph-backend-decode": "full", "cuda-graph-backend-prefill": "disabled",
                       "cuda-graph-max-bs-decode": 4})
    assert d["cuda_graph"] == "decode full" and d["capture_sizes"] == 4 and d["prefix_cache"] is True
    assert prof.apply_derived({"cuda-graph-max-bs-decode": "auto"}, [1, 2, 4]) == {"cuda-graph-max-bs-decode": 4}


# -- /tokenize ---------------------------------------------------------------------------------

@pytest.mark.parametrize("api, fixture, count", [("completions", "tokenize-prompt.json", 10),
                                                 ("chat", "tokenize-chat.json", 21)])
def test_token_count_from_recorded_tokenize(api, fixture, count):
    body = _json(fixture)
    assert body["count"] == len(body["tokens"]) == count and body["max_model_len"] == 131072
    sent: list[dict] = []

    def handler(req: httpx.Request) -> httpx.Response:
        assert req.url.path == "/tokenize"
        sent.append(json.loads(req.content))
        return httpx.Response(200, text=_text(fixture))

    tok = ServerTokenizer("http://127.0.0.1:30000", "/root/models/llama8b", api=api)
    tok.client = httpx.Client(transport=httpx.MockTransport(handler))
    assert tok.count("This is deterministic benchmark input text.") == count
    assert ("messages" in sent[0]) == (api == "chat") and ("prompt" in sent[0]) == (api != "chat")


def test_chat_template_tokens_wrap_the_prompt_tokens():
    prompt, chat = _json("tokenize-prompt.json")["tokens"], _json("tokenize-chat.json")["tokens"]
    body = prompt[1:]  # the prompt request's first id is the BOS the chat template also starts with
    start = next(i for i in range(len(chat)) if chat[i:i + len(body)] == body)
    assert chat[0] == prompt[0] and start > 1 and len(chat) - len(prompt) == 11


# -- /metrics ----------------------------------------------------------------------------------

METRICS = {
    # name: (kv_usage_frac, kv_capacity, running, waiting, cached tokens, prompt tokens, generation tokens,
    #        ttft_count, e2e_count, itl_count)
    "metrics-before.txt": (0.0, 857409, 0, 0, 0.0, 11.0, 8.0, 1.0, 1.0, None),
    "metrics-after.txt": (0.0, 857409, 0, 0, 1.0, 293965.0, 21528.0, 86.0, 86.0, 21420.0),
    "metrics-after-peers.txt": (0.0, 857409, 0, 0, 48510.0, 485195.0, 30840.0, 125.0, 125.0, 30693.0),
    "metrics-after-saturation.txt": (0.0, 857409, 0, 0, 48575.0, 681101.0, 226696.0, 891.0, 891.0, 225768.0),
}


@pytest.mark.parametrize("name", sorted(METRICS))
def test_parse_recorded_metrics(name):
    text = _text(name)
    assert engine_of(text) == "sglang"
    s = parse_metrics(text)
    kv, cap, run, wait, cached, prompt, gen, ttft_n, e2e_n, itl_n = METRICS[name]
    assert s.engine == "sglang"
    assert (s.kv_usage_frac, s.kv_capacity_tokens, s.running, s.waiting) == (kv, cap, run, wait)
    assert (s.prefix_cache_hits_total, s.prompt_tokens_total, s.generation_tokens_total) == (cached, prompt, gen)
    assert (s.ttft_count, s.e2e_count, s.itl_count) == (ttft_n, e2e_n, itl_n)
    # speculative acceptance: present as gauges on 0.5.16, 0 without speculative decoding
    assert s.spec_accept_length == 0.0 and s.cache_hit_rate == 0.0 and s.retracted_reqs == 0
    assert s.preemptions_total is None  # 0.5.16 has no cumulative retraction counter
    assert s.queue_count is not None and s.queue_count >= ttft_n
    assert s.prefix_cache_queries_total is None  # SGLang counts hits only


def test_recorded_metrics_values_exactly():
    s = parse_metrics(_text("metrics-after.txt"))
    assert s.ttft_sum_s == pytest.approx(24.71094827299993, abs=0)
    assert s.e2e_sum_s == pytest.approx(139.1532791430002, abs=0)
    assert s.itl_sum_s == pytest.approx(114.04157478800283, abs=0)
    assert (s.queue_sum_s, s.queue_count) == (pytest.approx(0.9109933650003086, abs=0), 87.0)


def test_cached_tokens_series_is_absent_until_the_first_hit():
    before = _text("metrics-before.txt")
    assert "sglang:cached_tokens_total" not in before and "sglang:prompt_tokens_total" in before
    assert parse_metrics(before).prefix_cache_hits_total == 0.0
    # the other 0.5.16 names the mapping relies on are all there
    for name in ("sglang:token_usage", "sglang:max_total_num_tokens", "sglang:num_running_reqs",
                 "sglang:num_queue_reqs", "sglang:spec_accept_length", "sglang:spec_accept_rate",
                 "sglang:time_to_first_token_seconds_sum", "sglang:queue_time_seconds_count"):
        assert f"\n{name}{{" in before, name


def test_bench_serving_without_cache_salt_hits_the_prefix_cache():
    """SGLang's bench_serving sends no cache_salt: its three runs on the same server reused
    48509 prompt tokens from the radix cache (servelab's run before it: 0)."""
    after, peers = parse_metrics(_text("metrics-after.txt")), parse_metrics(_text("metrics-after-peers.txt"))
    assert peers.prefix_cache_hits_total - after.prefix_cache_hits_total == 48509.0
    assert peers.prompt_tokens_total - after.prompt_tokens_total == 191230.0


# -- cache_salt isolation on the committed data ------------------------------------------------

@pytest.mark.parametrize("config", SGLANG_CONFIGS)
def test_no_prefix_cache_hits_across_a_run_with_unique_cache_salt(config):
    recs = pd.read_json(DATA / config / "records.jsonl", lines=True)
    assert recs["cache_salt"].notna().all() and recs["cache_salt"].is_unique  # one salt per request
    m = pd.read_json(DATA / config / "server_metrics.jsonl", lines=True)
    m = m[m["level"].notna()]
    assert len(m) > 10 and (m["engine"] == "sglang").all()
    hits, prompt = m["prefix_cache_hits_total"], m["prompt_tokens_total"]
    assert hits.notna().all() and hits.max() - hits.min() == 0  # the counter does not grow ...
    assert prompt.max() - prompt.min() > 100 * len(recs)         # ... while the prompts stream in


def test_vllm_rerun_has_no_prefix_cache_hits_either():
    m = pd.read_json(DATA / "vllm-cudagraph" / "server_metrics.jsonl", lines=True)
    assert (m["engine"] == "vllm").all()
    assert m["prefix_cache_hits_total"].max() == 0 and m["prefix_cache_queries_total"].max() > 290000


# -- GPU telemetry and the engine comparison (report/gpu.py) on the committed data --------------

def test_gpu_telemetry_and_engine_comparison_on_the_committed_data():
    from servelab.report.gpu import engine_comparison_table, gpu_configs, gpu_levels
    from servelab.report.load import load_study_data

    sd = load_study_data(DATA.parent)
    levels = gpu_levels(sd)
    conf = gpu_configs(sd, levels)
    assert list(conf["config"]) == ["sglang-cudagraph", "sglang-saturation", "vllm-cudagraph", "sglang-eager",
                                    "sglang-seed000"]
    c = conf.set_index("config")
    assert (c["energy_method"] == "counter").all() and (c["gpus"] == 1).all()
    assert c.loc["vllm-cudagraph", "gpu_mem_used_gib_peak"] == pytest.approx(128.03, abs=0.01)
    assert c.loc["sglang-cudagraph", "gpu_mem_used_gib_peak"] == pytest.approx(121.72, abs=0.01)
    jpt = levels.set_index(["config", "level"])["j_per_output_token"]
    assert jpt[("sglang-cudagraph", "in256-out256 c=4")] == pytest.approx(0.610, abs=0.001)
    assert jpt[("sglang-saturation", "in256-out256 c=128")] == pytest.approx(0.0593, abs=0.0001)
    assert c.loc["sglang-eager", "gpu_util_pct_mean"] < 40 < c.loc["sglang-cudagraph", "gpu_util_pct_mean"]
    cmp = engine_comparison_table(sd)
    assert set(cmp["config"]) == {"sglang-cudagraph", "vllm-cudagraph", "sglang-eager", "sglang-seed000"}
    assert len(cmp) == 9 * 4 and (cmp["reference"] == "vllm-cudagraph").all()
    row = cmp[(cmp["config"] == "sglang-cudagraph") & (cmp["bucket"] == "in256-out256") & (cmp["concurrency"] == 1)]
    assert row["aggregate_vs_reference"].iloc[0] == pytest.approx(1.0225, abs=0.0005)


@pytest.mark.parametrize("stem, n, conc", [("in256-out256-c1", 4, 1), ("in2048-out256-c4", 16, 4),
                                           ("in8192-out256-c4", 16, 4)])
def test_real_bench_serving_results_import(stem, n, conc):
    from servelab.analysis.sglang_bench import sglang_bench_reported as reported
    from servelab.results.peers import import_sglang_bench, read_objects

    path = DATA / "peer" / "sglang-cudagraph" / f"sglang-bench-{stem}.jsonl"
    df = import_sglang_bench(path, config="sglang-cudagraph")
    assert len(df) == n and df["ok"].all() and (df["concurrency"] == conc).all()
    assert (df["output_tokens"] == 256).all() and df["bucket"].iloc[0] == stem.rsplit("-c", 1)[0]
    rep = reported(read_objects(path)[0])
    assert rep["completed"] == n and rep["server_version"] == "0.5.16"
