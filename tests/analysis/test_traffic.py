"""`servelab workload from-log`: a workload block from a request log or a trace, that
`servelab validate` accepts."""

from __future__ import annotations

import json

import pytest
import yaml

from servelab.analysis.traffic import from_log, propose
from servelab.cli import main
from paths import FIXTURES

FIX = FIXTURES / "traces"


@pytest.mark.parametrize("name", ["azure-conv-2023-excerpt.csv", "mooncake-conversation-excerpt.jsonl"])
def test_from_log_on_both_trace_formats_validates(name, tmp_path, capsys):
    out = tmp_path / "wl.yaml"
    assert main(["workload", "from-log", str(FIX / name), "--out", str(out)]) == 0
    assert main(["validate", str(out)]) == 0
    assert "ok (a workload block: 3 buckets)" in capsys.readouterr().out
    wl = yaml.safe_load(out.read_text())["workload"]
    ins = [b["input_tokens"] for b in wl["buckets"]]
    assert ins == sorted(ins) and wl["arrival"] == "gamma"
    assert wl["rates_rps"][0] == pytest.approx(199 / (61.264 if name.endswith("csv") else 72.0), rel=0.01)
    assert wl["burstiness"] < 1  # both traces arrive in bursts
    assert ("prefix_reuse" in wl["buckets"][0]) == name.endswith("jsonl")  # only Mooncake has prefix ids


def test_openai_log_sizes_buckets_and_finds_the_resent_history(tmp_path):
    sys_msg = {"role": "system", "content": "x" * 300}
    rows = [
        {"timestamp": 0.0, "messages": [sys_msg, {"role": "user", "content": "a" * 100}],
         "usage": {"prompt_tokens": 100, "completion_tokens": 10}},
        {"timestamp": 1.0, "request": {"messages": [sys_msg, {"role": "user", "content": "a" * 100},
                                                    {"role": "assistant", "content": "b" * 100},
                                                    {"role": "user", "content": "c" * 100}]},
         "response": {"usage": {"prompt_tokens": 150, "completion_tokens": 20}}},
        {"timestamp": 3.0, "messages": [{"role": "user", "content": "z"}],
         "usage": {"prompt_tokens": 10, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": 5}}},
        {"timestamp": 4.0, "messages": [{"role": "user", "content": "no usage"}]},
    ]
    log = tmp_path / "log.jsonl"
    log.write_text("\n".join(json.dumps(r) for r in rows))
    obs = from_log(log.read_text(), str(log))
    assert len(obs) == 3
    assert [o.reused_share for o in obs] == [0.0, pytest.approx(400 / 600), 0.5]
    wl, info = propose(obs, n_buckets=1)
    assert wl["buckets"] == [{"name": "log-q1-in10-150", "input_tokens": 100, "output_tokens": 10,
                              "prefix_reuse": round((0 + 400 / 600 + 0.5) / 3, 2)}]
    assert info["rate_rps"] == pytest.approx(2 / 3, abs=1e-4)
