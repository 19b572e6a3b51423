"""Checks that know the engine, the model and the host (servelab.preflight): each refusal with
its class (error: the run would fail; warning: it may be fine where the study runs), through
`check_study`, `servelab validate` and `servelab run --dry-run`."""

from __future__ import annotations

import copy
import socket
from pathlib import Path

import pytest
import yaml
from servelab.cli import main
from servelab.preflight import check_study, preflight
from servelab.schema import ParamsError, load_study, study_from_dict
from paths import ROOT

LOCAL = yaml.safe_load((ROOT / "params" / "local-cpu-kv.yaml").read_text())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


LOCAL["engine"]["port"] = _free_port()  # the study's own 8011 may be held by a server on this machine


def _study(engine=None, workload=None, host=None, configurations=None, **top):
    """The KV study (local-cpu-kv) with one roomy configuration and these changes."""
    d = copy.deepcopy(LOCAL)
    d["configurations"] = configurations or [{"id": "only"}]
    d["engine"].update(engine or {})
    d["workload"].update(workload or {})
    if host is not None:
        d["host"] = host
    d.update(top)
    return study_from_dict(d, "s.yaml")


def _problems(study, level=None):
    return [(p.key, p.reason) for p in check_study(study) if level is None or p.level == level]


def test_default_study_has_no_error_and_warns_only_where_kv_tight_overflows_on_purpose():
    problems = [p for p in check_study(load_study(ROOT / "params" / "local-cpu-kv.yaml")) if p.key != "engine.port"]
    assert [p.level for p in problems] == ["warning", "warning"]
    assert all(p.key.startswith("configurations[1] (kv-tight): workload.buckets[") for p in problems)
    assert "from concurrency 4 on, 4 x 2,176 tokens exceed the KV cache (4,352 tokens" in problems[1].reason


def test_unknown_preset_is_an_error_with_did_you_mean():
    (err,) = check_study(_study(engine={"model": {"preset": "cpu-tny"}}))
    assert err.level == "error" and err.key == "engine.model.preset"
    assert err.reason.startswith("unknown model preset 'cpu-tny': did you mean 'cpu-tiny'")
    assert "known presets: cpu-tiny, llama-3.1-8b" in err.reason
    line = err.line("s.yaml")
    assert line.startswith("s.yaml: engine.model.preset: unknown model preset 'cpu-tny'")


def test_unknown_preset_without_a_close_one_lists_the_known():
    ((_, reason),) = _problems(_study(engine={"model": {"preset": "zzz-17"}}))
    assert "did you mean" not in reason and reason.startswith("unknown model preset 'zzz-17': known presets: ")


def test_missing_model_path_is_an_error_on_this_machine(tmp_path):
    missing = str(tmp_path / "no-such-model")
    assert _problems(_study(engine={"model": {"path": missing}}), "error") == [
        ("engine.model.path", f"{missing} does not exist (no such model directory)")]


def test_missing_model_path_is_a_warning_where_it_may_exist_elsewhere(tmp_path):
    missing = str(tmp_path / "weights")
    attach = {"kind": "attach", "attach": {"url": "http://127.0.0.1:9"}}
    (p,) = check_study(_study(engine={"model": {"path": missing}}, host=attach))
    assert p.level == "warning" and p.key == "engine.model.path"
    assert "does not exist on this machine (fine if it is a path on the attach host" in p.reason
    (p,) = check_study(_study(engine={"model": {"path": "org/model-7b"}}))  # local host, Hub id
    assert p.level == "warning" and "download it from the Hugging Face Hub" in p.reason


def test_model_path_that_exists_gives_its_context_length(tmp_path):
    (tmp_path / "config.json").write_text('{"max_position_embeddings": 1024}')
    s = _study(engine={"model": {"path": str(tmp_path)}, "args": {"enforce-eager": True}},
               workload={"buckets": [{"input_tokens": 1000, "output_tokens": 100}]})
    assert _problems(s) == [("workload.buckets[0] (in1000-out100)",
                             "prompt + output (1,000 + 100 = 1,100 tokens) exceeds the context length (the model's "
                             "max_position_embeddings 1,024 (engine.model.path)): the engine would refuse every "
                             "request")]


def test_prompt_over_max_model_len_is_an_error_naming_the_bucket():
    s = _study(workload={"buckets": [{"input_tokens": 8192, "output_tokens": 128},
                                     {"input_tokens": 4000, "output_tokens": 512},
                                     {"input_tokens": 3000, "output_tokens": 512}]})
    errs = _problems(s, "error")
    assert errs[0] == ("workload.buckets[0] (in8192-out128)", "the prompt (8,192 tokens) does not fit the context "
                       "length (engine.args.max-model-len 4,096): the engine would refuse every request")
    assert errs[1][0] == "workload.buckets[1] (in4000-out512)"
    assert errs[1][1].startswith("prompt + output (4,000 + 512 = 4,512 tokens) exceeds the context length "
                                 "(engine.args.max-model-len 4,096)")
    assert not any("in3000-out512" in k for k, _ in _problems(s))  # 3,512 fits


def test_without_max_model_len_the_models_own_context_bounds_the_prompt():
    args = {k: v for k, v in LOCAL["engine"]["args"].items() if k != "max-model-len"}
    d = copy.deepcopy(LOCAL)
    d["engine"]["args"] = args
    d["workload"]["buckets"] = [{"input_tokens": 10_000_000, "output_tokens": 16}]
    d["configurations"] = [{"id": "only"}]
    errs = [p for p in check_study(study_from_dict(d)) if p.level == "error"]
    assert errs[0].key == "workload.buckets[0] (in10000000-out16)"
    assert "10,000,000 tokens" in errs[0].reason and "max_position_embeddings 4,096 (engine.model.preset)" in errs[0].reason


def test_absurd_prompt_is_refused_when_no_context_is_known():
    attach = {"kind": "attach", "attach": {"url": "http://127.0.0.1:9"}}
    d = copy.deepcopy(LOCAL)
    d["engine"] = {"kind": "vllm"}
    d["host"] = attach
    d["workload"]["buckets"] = [{"input_tokens": 10_000_000, "output_tokens": 16},
                                {"input_tokens": 100_000, "output_tokens": 16}]
    d["configurations"] = [{"id": "only"}]
    (p,) = check_study(study_from_dict(d))
    assert p.level == "error" and p.key == "workload.buckets[0] (in10000000-out16)"
    assert "longer than any context this check knows (1,048,576)" in p.reason


def test_request_larger_than_the_whole_kv_cache_is_an_error_a_crowded_level_a_warning():
    # 8 blocks x 32 = 256 tokens of cache; 2048 + 128 can never be scheduled; 32 + 128 x 4 > 256 waits
    s = _study(engine={"args": {**LOCAL["engine"]["args"], "num-gpu-blocks-override": 8}},
               workload={"buckets": [{"input_tokens": 2048, "output_tokens": 128},
                                     {"input_tokens": 32, "output_tokens": 128}], "concurrency": [1, 4]})
    ps = {(p.level, p.key): p.reason for p in check_study(s)}
    assert ps[("error", "workload.buckets[0] (in2048-out128)")] == (
        "one request needs 2,176 tokens of KV cache, the cache holds 256 (num-gpu-blocks-override 8 x block-size "
        "32): it can never be scheduled")
    assert ps[("warning", "workload.buckets[1] (in32-out128)")].startswith(
        "from concurrency 4 on, 4 x 160 tokens exceed the KV cache (256 tokens")


def test_max_model_len_beyond_the_kv_memory_budget_is_an_error():
    # cpu-tiny: 4 layers x 2 x 4 kv heads x 64 x 2 bytes = 4,096 bytes per token; 8M holds 2,048 tokens
    s = _study(engine={"args": {**LOCAL["engine"]["args"], "kv-cache-memory-bytes": "8M"}},
               workload={"buckets": [{"input_tokens": 32, "output_tokens": 32}], "concurrency": [1]})
    (p,) = [p for p in check_study(s) if p.key == "engine.args.max-model-len"]
    assert p.level == "error" and p.reason.startswith("4,096 tokens do not fit the KV cache (2,048 tokens: "
                                                      "kv-cache-memory-bytes 8M at 4,096 bytes per token)")


def test_concurrency_above_max_num_seqs_is_a_warning():
    s = _study(engine={"args": {**LOCAL["engine"]["args"], "max-num-seqs": 2}},
               workload={"buckets": [{"input_tokens": 32, "output_tokens": 32}], "concurrency": [1, 4]})
    assert _problems(s) == [("engine.args.max-num-seqs", "2 < concurrency 4: the engine runs at most 2 requests at "
                             "once, the rest wait (the level measures queueing, not that concurrency)")]


def test_port_in_use_is_a_warning():
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        (p,) = check_study(_study(engine={"port": port}, workload={"buckets": [{"input_tokens": 32,
                                                                                 "output_tokens": 32}]}))
    assert p.level == "warning" and p.key == "engine.port" and f"127.0.0.1:{port} cannot be bound now" in p.reason


def test_config_override_problem_is_named_by_its_configuration():
    s = _study(configurations=[{"id": "a"}, {"id": "b", "engine": {"args": {"max-model-len": 128}}}],
               workload={"buckets": [{"input_tokens": 100, "output_tokens": 64}]})
    (p,) = check_study(s)
    assert p.level == "error" and p.key == "configurations[1] (b): workload.buckets[0] (in100-out64)"
    assert "engine.args.max-model-len 128" in p.reason


def test_unknown_engine_kind_names_the_known_ones(tmp_path):
    d = copy.deepcopy(LOCAL)
    d["engine"]["kind"] = "trt"
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(d))
    with pytest.raises(ParamsError) as e:
        load_study(tmp_path / "s.yaml")
    assert str(e.value) == f"{tmp_path / 's.yaml'}: engine.kind: Input should be 'vllm' or 'sglang' (got 'trt')"


def test_empty_params_file_says_so(tmp_path):
    (tmp_path / "empty.yaml").write_text("# nothing yet\n")
    with pytest.raises(ParamsError) as e:
        load_study(tmp_path / "empty.yaml")
    assert str(e.value).startswith(f"{tmp_path / 'empty.yaml'}: params file is empty")


def test_preflight_raises_errors_and_prints_warnings():
    got: list[str] = []
    s = _study(engine={"model": {"preset": "gpt-17"}, "args": {**LOCAL["engine"]["args"], "max-num-seqs": 1}})
    with pytest.raises(ParamsError) as e:
        preflight(s, "s.yaml", warn=got.append)
    assert str(e.value).startswith("s.yaml: engine.model.preset: unknown model preset 'gpt-17'")
    assert got == ["s.yaml: warning: engine.args.max-num-seqs: 1 < concurrency 16: the engine runs at most 1 "
                   "requests at once, the rest wait (the level measures queueing, not that concurrency)"]


def _write(tmp_path, **changes) -> Path:
    d = copy.deepcopy(LOCAL)
    d["configurations"] = [{"id": "only"}]
    for k, v in changes.items():
        d[k].update(v)
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(d))
    return p


def test_cli_validate_errors_exit_nonzero_warnings_exit_zero(tmp_path, capsys):
    bad = _write(tmp_path, engine={"model": {"preset": "gpt-17"}})
    assert main(["validate", str(bad)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"{bad}: engine.model.preset: unknown model preset 'gpt-17'")
    warned = _write(tmp_path, engine={"args": {**LOCAL["engine"]["args"], "max-num-seqs": 8}})
    assert main(["validate", str(warned)]) == 0
    out = capsys.readouterr()
    assert out.err.startswith(f"{warned}: warning: engine.args.max-num-seqs: 8 < concurrency 16")
    assert out.out.strip() == f"{warned}: ok (local-cpu-kv: 1 configurations, 1 warnings)"


def test_cli_dry_run_refuses_an_unknown_preset_before_printing_commands(tmp_path, capsys):
    bad = _write(tmp_path, engine={"model": {"preset": "gpt-17"}})
    assert main(["run", str(bad), "--dry-run"]) == 2
    out = capsys.readouterr()
    assert "<model:gpt-17>" not in out.out and "unknown model preset 'gpt-17'" in out.err


def test_cli_validate_checks_the_reduced_study_too(tmp_path, capsys):
    """`--reduced` (CI's size) is a study of its own: a `reduced` block that breaks a rule fails
    `servelab validate`, not the first `servelab run --reduced`."""
    bad = _write(tmp_path, workload={"canaries": True, "warmup_rounds": 1, "concurrency": [1, 4]})
    d = yaml.safe_load(bad.read_text())
    d["reduced"] = {"warmup_rounds": 0}
    bad.write_text(yaml.safe_dump(d))
    assert main(["validate", str(bad)]) == 1
    err = capsys.readouterr().err
    assert f"{bad}: its `reduced` block makes an invalid study" in err and "set warmup_rounds to 1" in err
    d["reduced"] = {"warmup_rounds": 0, "concurrency": [1]}  # no level with more than one in flight: no canary
    bad.write_text(yaml.safe_dump(d))
    assert main(["validate", str(bad)]) == 0


def test_a_gpt_oss_preset_on_chat_is_warned_before_a_server_starts():
    """vLLM renders gpt-oss's chat with the model's own Harmony tokens, which a preset's trained tokenizer lacks: every
    chat request failed on a real H100 (HTTP 500). Validate says so; a Llama-shaped preset on chat is fine."""
    warned = [p for p in _problems(_study(engine={"model": {"preset": "gpt-oss-20b"}}), "warning")
              if p[0] == "engine.model.preset"]
    assert len(warned) == 1 and "Harmony" in warned[0][1] and "HTTP 500" in warned[0][1]
    assert not [p for p in _problems(_study(engine={"model": {"preset": "phi-4"}}), "warning")
                if p[0] == "engine.model.preset"]
