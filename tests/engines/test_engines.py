"""Engine profiles: the seeds' launch commands come out of the params files flag for flag;
unknown and conflicting flags are errors; derived capture sizes; the smoke check."""

from __future__ import annotations

import json
import shlex

import httpx
import pytest
import yaml

from servelab import engines
from servelab.engines import smoke
from servelab.engines.vllm import derive_capture_sizes
from servelab.hosts import for_study
from servelab.schema import AwsParams, resolve_profile, validate_engines
from servelab.schema import Study
from servelab.analysis.cost import cost_estimate_lines
from servelab.engines import build_command
from paths import ROOT

PARAMS = ROOT / "params"

# The seeds' command lines, verbatim.
SEED_001_EAGER = """vllm serve nvidia/DeepSeek-V4-Flash-NVFP4 \\
  --revision 48bfe38c62be14e8d82f9e3be12fe5d30a2e38c8 \\
  --host 0.0.0.0 \\
  --port 8000 \\
  --tensor-parallel-size 2 \\
  --max-num-seqs 4 \\
  --max-num-batched-tokens 2048 \\
  --max-model-len 8192 \\
  --gpu-memory-utilization 0.95 \\
  --kv-cache-dtype fp8 \\
  --tokenizer-mode deepseek_v4 \\
  --reasoning-parser deepseek_v4 \\
  --tool-call-parser deepseek_v4 \\
  --enable-auto-tool-choice \\
  --trust-remote-code \\
  --enforce-eager"""
SEED_001_CUDA_GRAPH = {"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY", "cudagraph_capture_sizes": [1, 2, 4]}
SEED_001_MTP = {"method": "mtp", "num_speculative_tokens": 1}

SEED_000_INITIAL = """python3 -m sglang.launch_server \\
  --model-path <モデルのパス> \\
  --served-model-name deepseek-ai/DeepSeek-V4.1-Flash-1017 \\
  --host 0.0.0.0 --port 8000 \\
  --tp-size 4 --ep-size 4 \\
  --context-length 4096 \\
  --chunked-prefill-size 2048 \\
  --mem-fraction-static 0.85 \\
  --max-running-requests 1 \\
  --disable-custom-all-reduce \\
  --disable-radix-cache \\
  --reasoning-parser auto \\
  --tool-call-parser auto \\
  --enable-deepseek-v4-fp4-indexer \\
  --cuda-graph-backend-decode disabled \\
  --cuda-graph-backend-prefill disabled"""
SEED_000_CUDA_GRAPH = "--cuda-graph-backend-decode full --cuda-graph-backend-prefill disabled --cuda-graph-max-bs-decode 1"
SEED_000_DSPARK = "--speculative-algorithm DSPARK --speculative-dspark-block-size 5"
SEED_000_ENV = {
    "SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE": "true",
    "SGLANG_DSV41_ENGRAM_HOST_TABLE_LAYOUT": "private",
    "SGLANG_DSV41_ENGRAM_HOST_TABLE_PIN": "true",
    "SGLANG_ENABLE_DSV41_ENGRAM_DROP_PAGE_CACHE": "false",
    "SGLANG_SM120_FLASHMLA_BACKEND": "triton",
    "SGLANG_DEFAULT_THINKING": "false",
}


def load(name: str) -> Study:
    return Study.model_validate(yaml.safe_load((PARAMS / name).read_text()))


def argv(study: Study, cid: str) -> list[str]:
    eng = resolve_profile(study, cid)
    return build_command(eng, eng.model.path, python="python3")


def pairs(tokens: list[str]) -> list[tuple[str, str | None]]:
    """[(--flag, value or None)] in order, from the first --flag on."""
    out: list[tuple[str, str | None]] = []
    i = next(i for i, t in enumerate(tokens) if t.startswith("--"))
    while i < len(tokens):
        flag = tokens[i]
        if i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
            out.append((flag, tokens[i + 1]))
            i += 2
        else:
            out.append((flag, None))
            i += 1
    return out


def seed_tokens(cmd: str) -> list[str]:
    return shlex.split(cmd.replace("\\\n", " "))


# -- seed 001 ----------------------------------------------------------------------------------
def test_seed001_eager_is_the_seed_command_with_a_16k_context():
    s = load("seed-001-vllm-g7e.yaml")
    ours = argv(s, "eager")
    seed = seed_tokens(SEED_001_EAGER)
    # `vllm serve MODEL` is the `vllm` console script = python -m vllm.entrypoints.cli.main
    assert seed[:3] == ["vllm", "serve", "nvidia/DeepSeek-V4-Flash-NVFP4"]
    assert ours[:5] == ["python3", "-m", "vllm.entrypoints.cli.main", "serve", "nvidia/DeepSeek-V4-Flash-NVFP4"]
    got = pairs(ours)
    # --revision comes first in the seed, --host/--port first in ours: compare in order otherwise
    expected = [(f, v) for f, v in pairs(seed)]
    expected_wo = [p for p in expected if p[0] not in ("--host", "--port", "--revision")]
    got_wo = [p for p in got if p[0] not in ("--host", "--port", "--revision")]
    diff = [(a, b) for a, b in zip(expected_wo, got_wo) if a != b]
    assert diff == [(("--max-model-len", "8192"), ("--max-model-len", "16384"))]  # the one documented change
    assert len(expected_wo) == len(got_wo)
    assert dict(got)["--revision"] == dict(expected)["--revision"] == "48bfe38c62be14e8d82f9e3be12fe5d30a2e38c8"
    assert dict(got)["--host"] == "0.0.0.0" and dict(got)["--port"] == "8000"
    assert "--load-format" not in dict(got)  # real weights, as in the seed


def test_seed001_cuda_graph_json_and_batch_budget_and_mtp():
    s = load("seed-001-vllm-g7e.yaml")
    assert [c.id for c in s.configurations] == ["eager", "cuda-graph", "mbt-4096", "mbt-8192", "mbt-16384", "mtp1"]
    cg = dict(pairs(argv(s, "cuda-graph")))
    assert "--enforce-eager" not in cg
    assert json.loads(cg["--compilation-config"]) == SEED_001_CUDA_GRAPH
    assert cg["--max-num-batched-tokens"] == "2048"
    for budget in (4096, 8192, 16384):
        a = dict(pairs(argv(s, f"mbt-{budget}")))
        assert a["--max-num-batched-tokens"] == str(budget)
        assert json.loads(a["--compilation-config"]) == SEED_001_CUDA_GRAPH
    # everything else equals the CUDA-graph configuration: one variable at a time
    base = dict(pairs(argv(s, "cuda-graph")))
    for budget in (4096, 8192, 16384):
        a = dict(pairs(argv(s, f"mbt-{budget}")))
        assert {k for k in a.keys() | base.keys() if a.get(k) != base.get(k)} == {"--max-num-batched-tokens"}
    mtp = dict(pairs(argv(s, "mtp1")))
    assert json.loads(mtp["--speculative-config"]) == SEED_001_MTP
    sizes = json.loads(mtp["--compilation-config"])["cudagraph_capture_sizes"]
    assert 8 in sizes and sizes == [1, 2, 4, 8]  # 4 requests x (1 + 1) tokens
    assert mtp["--max-num-batched-tokens"] == "4096"  # the adopted budget


def test_seed_baselines_make_every_comparison_one_change():
    from servelab.analysis import config_diff

    def diffs(name):
        s = load(name)
        return {c.id: (c.baseline, [p for p, _, _ in config_diff(resolve_profile(s, c.baseline).model_dump(),
                                                                 resolve_profile(s, c.id).model_dump())])
                for c in s.configurations if c.baseline}

    cg = ["args.compilation-config.cudagraph_capture_sizes", "args.compilation-config.cudagraph_mode",
          "args.compilation-config.mode", "args.enforce-eager"]  # the CUDA-graph change: one flag set
    assert diffs("seed-001-vllm-g7e.yaml") == {
        "cuda-graph": ("eager", cg),
        "mbt-4096": ("cuda-graph", ["args.max-num-batched-tokens"]),
        "mbt-8192": ("cuda-graph", ["args.max-num-batched-tokens"]),
        "mbt-16384": ("cuda-graph", ["args.max-num-batched-tokens"]),
        # MTP on the adopted 4096 budget: the speculative config and the capture sizes it needs (1/2/4 -> 1/2/4/8)
        "mtp1": ("mbt-4096", ["args.compilation-config.cudagraph_capture_sizes", "args.speculative-config.method",
                              "args.speculative-config.num_speculative_tokens"]),
    }
    s = load("seed-001-vllm-g7e.yaml")
    d = config_diff(resolve_profile(s, "mbt-4096").model_dump(), resolve_profile(s, "mtp1").model_dump())
    assert d[0] == ("args.compilation-config.cudagraph_capture_sizes", [1, 2, 4], [1, 2, 4, 8])
    assert diffs("seed-000-sglang-g7e.yaml") == {
        "cuda-graph": ("eager", ["args.cuda-graph-backend-decode", "args.cuda-graph-max-bs-decode"]),
        "dspark": ("cuda-graph", ["args.speculative-algorithm", "args.speculative-dspark-block-size"]),
    }
    engram = ["env.SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE"]
    assert diffs("seed-000-sglang-g7e-8gpu.yaml") == {
        "cuda-graph-no-offload": ("cuda-graph-offload", engram),
        "dspark-offload": ("cuda-graph-offload", ["args.speculative-algorithm", "args.speculative-dspark-block-size"]),
        "dspark-no-offload": ("dspark-offload", engram),
    }


def test_seed001_names_its_stack():
    aws = load("seed-001-vllm-g7e.yaml").host.aws
    assert (aws.stack.name, aws.stack.create, aws.stack_region) == ("servelab-seed-001", True, "us-east-1")
    assert aws.stack.parameters == {"InstanceType": "g7e.12xlarge", "GpuCount": 2,
                                    "EngineImage": "vllm/vllm-openai:v0.26.0", "RootVolumeGiB": 300}
    assert aws.cluster is None and aws.service is None  # from the stack's outputs
    with pytest.raises(ValueError, match="stack.region eu-west-2 is not one of regions"):
        AwsParams(regions=["us-east-1"], instance_type="g7e.12xlarge", max_hours=1,
                  stack={"name": "s", "region": "eu-west-2"})


def test_seed001_every_configuration_validates_at_the_study_concurrency():
    s = load("seed-001-vllm-g7e.yaml")
    for c in s.configurations:
        e = resolve_profile(s, c.id)
        assert engines.validate_engine(e.kind, e.args, e.env, s.workload.concurrency) == [], c.id
    # the seed's warning, as an error: MTP with the CUDA-graph sizes 1/2/4 misses 8
    e = s.engine_for("mtp1")
    args = {**e.args, "compilation-config": SEED_001_CUDA_GRAPH}
    errs = engines.get("vllm").validate_args(args, concurrency=[1, 2, 4])
    assert errs == ["compilation-config.cudagraph_capture_sizes [1, 2, 4] stops below 8 (4 requests x (1 + 1) "
                    "tokens): that batch would run without a CUDA graph; include 8 or use 'auto'"]


# -- seed 000 ----------------------------------------------------------------------------------
def test_seed000_initial_sglang_command():
    s = load("seed-000-sglang-g7e.yaml")
    ours = argv(s, "eager")
    seed = seed_tokens(SEED_000_INITIAL)
    assert ours[:3] == seed[:3] == ["python3", "-m", "sglang.launch_server"]
    got, want = dict(pairs(ours)), dict(pairs(seed))
    assert got.pop("--model-path") == "deepseek-ai/DeepSeek-V4.1-Flash-1017"
    assert want.pop("--model-path") == "<モデルのパス>"
    assert got.pop("--revision") == "1bae0e1088993b9b82de08f59de5be5a34e42170"  # pinned in the seed's prose
    assert got == want
    skip = ("--model-path", "--revision", "--host", "--port")  # build_command puts host/port first
    assert [f for f, _ in pairs(ours) if f not in skip] == [f for f, _ in pairs(seed) if f not in skip]


def test_seed000_cuda_graph_dspark_and_env():
    s = load("seed-000-sglang-g7e.yaml")
    assert [c.id for c in s.configurations] == ["eager", "cuda-graph", "dspark"]
    cg = dict(pairs(argv(s, "cuda-graph")))
    assert dict(pairs(SEED_000_CUDA_GRAPH.split())).items() <= cg.items()  # max-bs 'auto' -> 1
    eager = dict(pairs(argv(s, "eager")))
    assert {k for k in cg.keys() | eager.keys() if cg.get(k) != eager.get(k)} == {
        "--cuda-graph-backend-decode", "--cuda-graph-max-bs-decode"}
    ds = dict(pairs(argv(s, "dspark")))
    assert dict(pairs(SEED_000_DSPARK.split())).items() <= ds.items()
    assert {k for k in ds.keys() | cg.keys() if ds.get(k) != cg.get(k)} == {
        "--speculative-algorithm", "--speculative-dspark-block-size"}
    for c in s.configurations:
        e = resolve_profile(s, c.id)
        assert e.env == SEED_000_ENV
        assert engines.validate_engine(e.kind, e.args, e.env, s.workload.concurrency) == [], c.id
    assert engines.get("sglang").spec_tokens(resolve_profile(s, "dspark").args) == 5


def test_seed000_eight_gpus_engram_on_off():
    s = load("seed-000-sglang-g7e-8gpu.yaml")
    assert s.host.aws.instance_type == "g7e.48xlarge"
    for c in s.configurations:
        e = resolve_profile(s, c.id)
        a = dict(pairs(build_command(e, e.model.path, python="python3")))
        assert a["--tp-size"] == "8" and a["--ep-size"] == "8"
        assert a["--cuda-graph-backend-decode"] == "full" and a["--cuda-graph-max-bs-decode"] == "1"
        offload = e.env["SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE"]
        assert offload == ("false" if "no-offload" in c.id else "true")
        assert ("--speculative-algorithm" in a) == c.id.startswith("dspark")
        assert engines.validate_engine(e.kind, e.args, e.env, s.workload.concurrency) == [], c.id
    four = load("seed-000-sglang-g7e.yaml")
    assert four.host.aws.instance_type == "g7e.24xlarge"


def test_dry_run_lines_call_no_aws(monkeypatch):
    import boto3

    def boom(*a, **k):
        raise AssertionError("a dry run must not create an AWS client")

    monkeypatch.setattr(boto3, "Session", boom)
    monkeypatch.setattr(boto3, "client", boom)
    for name in ("seed-001-vllm-g7e.yaml", "seed-000-sglang-g7e.yaml", "seed-000-sglang-g7e-8gpu.yaml"):
        s = load(name)
        plan = for_study(s).plan_lines({c.id: resolve_profile(s, c.id) for c in s.configurations})
        assert any("ecs:UpdateService" in ln and "desiredCount=1" in ln for ln in plan)
        assert any("DesiredCapacity=0" in ln for ln in plan)
        assert any("sts:GetCallerIdentity" in ln for ln in plan)
        assert sum("ecs:RegisterTaskDefinition" in ln for ln in plan) == len(s.configurations)
        cost = cost_estimate_lines(s)
        assert any(ln.startswith(f"cost: {s.host.aws.instance_type} ") for ln in cost)
        assert any("managed reference" in ln for ln in cost)


# -- validation --------------------------------------------------------------------------------
@pytest.mark.parametrize("kind,args,expected", [
    ("vllm", {"max-num-seq": 4}, "unknown flag 'max-num-seq' (did you mean 'max-num-seqs'?)"),
    ("vllm", {"chunked-prefill-size": 2048},
     "'chunked-prefill-size' is an SGLang flag, not a vLLM one; use max-num-batched-tokens"),
    ("sglang", {"max-num-seqs": 4}, "'max-num-seqs' is a vLLM flag, not an SGLang one; use max-running-requests"),
    ("sglang", {"enforce-eager": True}, "'enforce-eager' is a vLLM flag, not an SGLang one; use "
     "cuda-graph-backend-decode: disabled and cuda-graph-backend-prefill: disabled"),
    ("vllm", {"port": 9000}, "port: set engine.port instead (servelab passes --port itself)"),
    ("vllm", {"enforce-eager": True, "compilation-config": {"cudagraph_mode": "FULL_DECODE_ONLY"}},
     "enforce-eager disables CUDA graphs but compilation-config.cudagraph_mode is FULL_DECODE_ONLY: set "
     "enforce-eager: false (or cudagraph_mode: NONE)"),
    ("vllm", {"enable-prefix-caching": True, "no-enable-prefix-caching": True},
     "enable-prefix-caching and no-enable-prefix-caching are both set"),
    ("vllm", {"speculative-config": {"method": "mtp"}},
     "speculative-config needs num_speculative_tokens (e.g. {method: mtp, num_speculative_tokens: 1})"),
    ("vllm", {"enable-auto-tool-choice": True}, "enable-auto-tool-choice needs tool-call-parser"),
    ("vllm", {"max-num-seqs": "four"}, "max-num-seqs: expected an integer, got 'four'"),
    ("vllm", {"max-model-len": True}, "max-model-len: needs a value (true would pass it bare)"),
    ("vllm", {"compilation-config": {"cudagraph_mode": "SOMETIMES"}},
     "compilation-config.cudagraph_mode: 'SOMETIMES' is not one of ['FULL', 'FULL_AND_PIECEWISE', "
     "'FULL_DECODE_ONLY', 'NONE', 'PIECEWISE']"),
    ("vllm", {"max_num_seqs": 2, "max-num-seqs": 4}, "max-num-seqs: same flag as 'max_num_seqs'"),
    ("sglang", {"tp-size": 4, "tensor-parallel-size": 4}, "tensor-parallel-size: same flag as 'tp-size'"),
    ("sglang", {"speculative-dspark-block-size": 5}, "speculative-dspark-block-size needs speculative-algorithm"),
    ("sglang", {"speculative-algorithm": "EAGLE", "speculative-dspark-block-size": 5},
     "speculative-dspark-block-size is a DSPARK option, speculative-algorithm is EAGLE"),
    ("sglang", {"cuda-graph-backend-decode": "disabled", "cuda-graph-max-bs-decode": 1},
     "cuda-graph-max-bs-decode is set but the decode CUDA graph is disabled"),
    ("sglang", {"cuda-graph-backend-decode": "on"},
     "cuda-graph-backend-decode: 'on' is not one of ['breakable', 'disabled', 'full']"),
    ("sglang", {"disable-cuda-graph": True, "cuda-graph-backend-decode": "full"},
     "disable-cuda-graph conflicts with a cuda-graph-backend-* other than 'disabled'"),
    ("sglang", {"tp-size": 4, "ep-size": 3}, "ep-size 3 must divide tp-size 4"),
])
def test_unknown_and_conflicting_flags_are_errors(kind, args, expected):
    assert engines.get(kind).validate_args(args) == [expected]


def test_concurrency_checks_for_sglang():
    args = {"cuda-graph-backend-decode": "full", "cuda-graph-max-bs-decode": 2}
    assert engines.get("sglang").validate_args(args, concurrency=[1, 2]) == []
    assert engines.get("sglang").validate_args(args, concurrency=[1, 4]) == [
        "cuda-graph-max-bs-decode 2 < concurrency 4: larger decode batches run without a CUDA graph; "
        "raise it or use 'auto'"]


def test_env_checks():
    assert engines.get("sglang").validate_env(SEED_000_ENV) == []
    assert engines.get("vllm").validate_env({"SGLANG_DEFAULT_THINKING": "false"}) == [
        "env SGLANG_DEFAULT_THINKING: an SGLang variable on a vllm engine"]
    assert engines.get("sglang").validate_env({"SGLANG_DEFAULT_THINKING": "maybe"}) == [
        "env SGLANG_DEFAULT_THINKING: expected true or false, got 'maybe'"]


def test_derive_capture_sizes():
    assert derive_capture_sizes([1, 2, 4], 1) == [1, 2, 4, 8]
    assert derive_capture_sizes([1, 2, 4], 0) == [1, 2, 4]
    assert derive_capture_sizes([1, 4, 16], 3) == [1, 4, 16, 64]
    with pytest.raises(ValueError):
        derive_capture_sizes([0], 1)
    args = {"compilation-config": {"cudagraph_mode": "FULL_DECODE_ONLY", "cudagraph_capture_sizes": "auto"},
            "speculative-config": {"method": "mtp", "num_speculative_tokens": 2}}
    out = engines.get("vllm").apply_derived(args, [1, 2])
    assert out["compilation-config"]["cudagraph_capture_sizes"] == [1, 2, 3, 6]
    assert args["compilation-config"]["cudagraph_capture_sizes"] == "auto"  # input untouched
    assert engines.get("sglang").apply_derived({"cuda-graph-max-bs-decode": "auto"}, [1, 8, 2]) == {
        "cuda-graph-max-bs-decode": 8}


def test_default_study_and_test_engine_flags_are_known():
    from conftest import CPU_ARGS

    data = yaml.safe_load((PARAMS / "local-cpu-kv.yaml").read_text())
    assert engines.get("vllm").validate_args(data["engine"]["args"]) == []
    for c in data["configurations"]:
        assert engines.get("vllm").validate_args({**data["engine"]["args"], **c.get("engine", {}).get("args", {})}) == []
    assert engines.get("vllm").validate_args(CPU_ARGS) == []


def test_registries_cover_the_seed_and_common_flags():
    vllm = set(engines.get("vllm").known_flags())
    for f in ("tensor-parallel-size", "pipeline-parallel-size", "data-parallel-size", "enable-expert-parallel",
              "max-model-len", "max-num-batched-tokens", "max-num-seqs", "gpu-memory-utilization", "kv-cache-dtype",
              "enforce-eager", "compilation-config", "speculative-config", "enable-prefix-caching",
              "no-enable-prefix-caching", "reasoning-parser", "tool-call-parser", "enable-auto-tool-choice",
              "trust-remote-code", "tokenizer-mode", "revision", "dtype", "block-size", "num-gpu-blocks-override",
              "kv-cache-memory-bytes", "served-model-name", "max-num-partial-prefills", "quantization"):
        assert f in vllm, f
    sgl = set(engines.get("sglang").known_flags())
    for f in ("tp-size", "ep-size", "dp-size", "context-length", "chunked-prefill-size", "mem-fraction-static",
              "max-running-requests", "disable-custom-all-reduce", "disable-radix-cache", "reasoning-parser",
              "tool-call-parser", "enable-deepseek-v4-fp4-indexer", "cuda-graph-backend-decode",
              "cuda-graph-backend-prefill", "cuda-graph-max-bs-decode", "disable-cuda-graph", "speculative-algorithm",
              "speculative-dspark-block-size", "speculative-num-steps", "speculative-eagle-topk",
              "speculative-num-draft-tokens", "enable-metrics", "served-model-name", "kv-cache-dtype",
              "trust-remote-code", "revision", "attention-backend"):
        assert f in sgl, f


# -- smoke check -------------------------------------------------------------------------------
def _server(reply: str = "日本の首都は**東京**です。", tool: dict | None = None, status: int = 200):
    seen: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append({"body": body, "headers": dict(request.headers)})
        if status != 200:
            return httpx.Response(status, json={"error": {"message": "overloaded"}})
        if "tools" in body:
            calls = [] if tool is None else [{"id": "c1", "type": "function", "function": tool}]
            msg = {"role": "assistant", "content": None, "tool_calls": calls}
        else:
            msg = {"role": "assistant", "content": reply}
        return httpx.Response(200, json={"choices": [{"index": 0, "message": msg, "finish_reason": "stop"}],
                                         "usage": {"prompt_tokens": 12, "completion_tokens": 8}})

    return httpx.Client(transport=httpx.MockTransport(handler)), seen


def test_smoke_check_records_chat_and_tool_call():
    client, seen = _server(tool={"name": "get_weather", "arguments": "{\"city\": \"Tokyo\"}"})
    r = smoke.smoke_check("http://alb.internal/v1", "deepseek-ai/DeepSeek-V4.1-Flash-1017",
                             {"X-LLM-Profile": "dsv41"}, tool_call=True, client=client)
    assert r["applies"] is True and r["ok"] is True and r["answered"] is True and r["reason"] is None
    assert r["chat"]["text"] == "日本の首都は**東京**です。"
    assert r["tool_call"]["function"] == {"name": "get_weather", "arguments": "{\"city\": \"Tokyo\"}"}
    assert r["tool_call"]["arguments"] == {"city": "Tokyo"}
    assert seen[0]["body"]["messages"][0]["content"] == smoke.SMOKE_PROMPT
    assert seen[1]["body"]["tool_choice"] == "required" and seen[1]["body"]["tools"] == [smoke.WEATHER_TOOL]
    assert seen[0]["headers"]["x-llm-profile"] == "dsv41"


def test_smoke_check_without_parser_sends_no_tool_call():
    client, seen = _server()
    r = smoke.smoke_check("http://x", "m", tool_call=False, client=client)
    assert r["ok"] is True and r["tool_call"] is None and len(seen) == 1


def test_smoke_check_failures_say_why():
    client, _ = _server(tool={"name": "get_time", "arguments": "{}"})
    r = smoke.smoke_check("http://x", "m", tool_call=True, client=client)
    assert r["ok"] is False and r["answered"] is True
    assert r["reason"].startswith("tool call: expected get_weather with a city")
    client, _ = _server(status=503)
    r = smoke.smoke_check("http://x", "m", client=client)
    assert r["ok"] is False and r["answered"] is False and "HTTP 503" in r["reason"]


def test_smoke_check_with_dummy_weights_does_not_apply():
    client, seen = _server(reply="zq vx random", tool=None)
    r = smoke.smoke_check("http://x", "m", tool_call=True, dummy_weights=True, client=client)
    assert r["applies"] is False and r["ok"] is None and r["answered"] is True
    assert r["reason"].startswith("dummy weights")
    assert r["chat"]["text"] == "zq vx random" and len(seen) == 2  # still sent and recorded


def test_validate_study_names_the_configuration():
    for name in ("seed-001-vllm-g7e.yaml", "seed-000-sglang-g7e.yaml", "seed-000-sglang-g7e-8gpu.yaml"):
        assert validate_engines(load(name)) == [], name
    data = yaml.safe_load((PARAMS / "seed-001-vllm-g7e.yaml").read_text())
    data["configurations"][5]["engine"]["args"]["compilation-config"]["cudagraph_capture_sizes"] = [1, 2, 4]
    data["configurations"][1]["engine"]["args"]["max-num-seq"] = 4
    from servelab.schema import ParamsError, study_from_dict

    with pytest.raises(ParamsError) as e:  # config.Study runs validate_study: a params file cannot load
        study_from_dict(data, "seed-001.yaml")
    assert str(e.value).splitlines() == [
        "seed-001.yaml: <top>: configurations[1] (cuda-graph): engine: unknown flag 'max-num-seq' "
        "(did you mean 'max-num-seqs'?)",
        "seed-001.yaml: <top>: configurations[5] (mtp1): engine: compilation-config.cudagraph_capture_sizes "
        "[1, 2, 4] stops below 8 (4 requests x (1 + 1) tokens): that batch would run without a CUDA graph; "
        "include 8 or use 'auto'",
    ]


def test_a_plan_resolves_each_configuration_once_on_one_host():
    """plan_study: every configuration's engine with its derived values, its workload, and one
    host shared by all (the pipeline makes it once per run)."""
    from servelab.plan import plan_study

    s = load("seed-001-vllm-g7e.yaml")
    plans = plan_study(s)
    assert list(plans) == [c.id for c in s.configurations]
    assert len({id(p.host) for p in plans.values()}) == 1
    for cid, p in plans.items():
        assert p.engine == resolve_profile(s, cid) and p.workload == s.workload_for(cid)
        assert p.command() == build_command(p.engine, p.engine.model.path or f"<model:{p.engine.model.preset}>")
    import dataclasses

    with pytest.raises(dataclasses.FrozenInstanceError):
        plans[s.configurations[0].id].engine = None


def test_a_configuration_of_another_model_gets_no_default_baseline():
    from servelab.analysis.verdicts import baselines

    def of(s, levels=None):
        ids = [c.id for c in s.configurations]
        return ids, baselines(ids, {c.id: c.baseline for c in s.configurations}, s.same_model, levels)

    s = load("h200-perfmodel.yaml")
    ids, base = of(s)
    assert ids == ["qwen3moe", "qwen3moe-greedy", "llama8b", "dsv2lite", "mixtral8x7b", "llama2-7b"]
    assert base == {"qwen3moe-greedy": "qwen3moe"}  # the other shapes compare with nothing
    s = load("local-cpu.yaml")  # one model throughout: every later configuration has one
    ids, base = of(s)
    assert set(base) == set(ids[1:])
    # a configuration sharing no level with an earlier one of its model has no default baseline,
    # and a check-only one (no levels) keeps the baseline its params name
    levels = {c: {("a", 1)} for c in ids}
    levels[ids[2]] = {("b", 1)}
    levels[ids[3]] = set()
    _, base = of(s, levels)
    assert [base.get(c) for c in ids[2:4]] == [s.config(c).baseline for c in ids[2:4]]
    assert base[ids[4]] == (s.config(ids[4]).baseline or ids[1])

def test_cpu_engine_leaves_a_core_to_the_server_and_the_client(monkeypatch):
    """On CPU the vLLM engine gets every usable core but one as torch threads (its own worker skips
    the reduction), unless the shell or engine.env says otherwise; a GPU host adds nothing."""
    from servelab.engines import vllm as vllm_profile
    from servelab.hosts.process import engine_env
    from servelab.schema import EngineParams

    prof = engines.get("vllm")
    p = EngineParams.model_validate({"kind": "vllm", "model": {"preset": "smollm2-135m"}})
    monkeypatch.setattr(vllm_profile, "has_gpu", lambda: False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    for cores, threads in ((1, 1), (2, 1), (16, 15)):
        monkeypatch.setattr(vllm_profile.os, "sched_getaffinity", lambda _pid, n=cores: set(range(n)))
        assert prof.environment(p)["OMP_NUM_THREADS"] == str(threads)
        assert prof.environment(p)["NUMBA_NUM_THREADS"] == str(threads)  # the n-gram proposer's pool
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert "OMP_NUM_THREADS" not in prof.environment(p)
    assert engine_env(p)["OMP_NUM_THREADS"] == "2"
    monkeypatch.delenv("OMP_NUM_THREADS")
    set_by_params = EngineParams.model_validate({"kind": "vllm", "model": {"preset": "smollm2-135m"},
                                                 "env": {"OMP_NUM_THREADS": "4"}})
    assert engine_env(set_by_params)["OMP_NUM_THREADS"] == "4"
    assert prof.environment(p)["THP_MEM_ALLOC_ENABLE"] == "1" and prof.env_to_record("THP_MEM_ALLOC_ENABLE")
    monkeypatch.setattr(vllm_profile, "has_gpu", lambda: True)
    assert not {"OMP_NUM_THREADS", "NUMBA_NUM_THREADS", "THP_MEM_ALLOC_ENABLE"} & set(prof.environment(p))
