"""Malformed params: each case and the exact error lines it produces (file, key path, expectation)."""

from __future__ import annotations

import copy

import pytest
import yaml

from servelab.schema import ParamsError, load_study
from paths import ROOT

BASE = yaml.safe_load((ROOT / "params" / "local-cpu-kv.yaml").read_text())


def m(path, val, delete=False):
    d = copy.deepcopy(BASE)
    cur = d
    for k in path[:-1]:
        cur = cur[k]
    if delete:
        del cur[path[-1]]
    else:
        cur[path[-1]] = val
    return d


CASES = {
 "top-level typo": m(["titel"], "x"),
 "missing title": m(["title"], None, delete=True),
 "study id with space": m(["study"], "local cpu"),
 "language not en/ja": m(["language"], "fr"),
 "host kind unknown": m(["host"], {"kind": "kubernetes"}),
 "attach without url": m(["host"], {"kind": "attach"}),
 "attach url without scheme": m(["host"], {"kind": "attach", "attach": {"url": "localhost:8000"}}),
 "secret header in params": m(["host"], {"kind": "attach", "attach": {"url": "http://x:1", "headers": {"Authorization": "Bearer sk"}}}),
 "engine kind unknown": m(["engine", "kind"], "tgi"),
 "port out of range": m(["engine", "port"], 70000),
 "model with preset and path": m(["engine", "model"], {"preset": "cpu-tiny", "path": "/m"}),
 "api key as engine flag": m(["engine", "args", "api-key"], "sk-123"),
 "secret in engine env": m(["engine", "env"], {"HF_TOKEN": "hf_x"}),
 "startup timeout negative": m(["engine", "startup_timeout_s"], -5),
 "workload typo": m(["workload", "concurency"], [1]),
 "concurrency zero": m(["workload", "concurrency"], [0, 4]),
 "concurrency empty": m(["workload", "concurrency"], []),
 "rounds not an int": m(["workload", "rounds"], "five"),
 "bucket key typo": m(["workload", "buckets"], [{"input_tokens": 32, "output_token": 8}]),
 "negative output tokens": m(["workload", "buckets"], [{"input_tokens": 32, "output_tokens": -8}]),
 "api unknown": m(["workload", "api"], "responses"),
 "poisson without rates": m(["workload", "arrival"], "poisson"),
 "failure budget > 1": m(["workload", "failure_budget"], 1.5),
 "slo error rate > 1": m(["slo", "error_rate"], 2),
 "duplicate configuration ids": m(["configurations"], [{"id": "a"}, {"id": "a"}]),
 "configuration override typo": m(["configurations"], [{"id": "a", "engine": {"portt": 1}}]),
 "no configurations": m(["configurations"], []),
 "configuration id with slash": m(["configurations"], [{"id": "a/b"}]),
 "baseline not an earlier configuration": m(["configurations"], [{"id": "a", "baseline": "b"}, {"id": "b"}]),
}

EXPECTED = {
    'top-level typo': "bad.yaml: titel: unknown key (did you mean 'title'?)",
    'missing title': 'bad.yaml: title: required key is missing',
    'study id with space': "bad.yaml: study: String should match pattern '^[A-Za-z0-9][A-Za-z0-9_.-]*$' (got 'local cpu')",
    'language not en/ja': "bad.yaml: language: Input should be 'en' or 'ja' (got 'fr')",
    'host kind unknown': "bad.yaml: host.kind: Input should be 'local', 'attach', 'aws-ecs' or 'aws-instance' (got 'kubernetes')",
    'attach without url': "bad.yaml: host.attach: required key is missing",
    'attach url without scheme': "bad.yaml: host.attach: url must start with http:// or https://, got 'localhost:8000'",
    'secret header in params': 'bad.yaml: host.attach: header Authorization: secrets come only from the environment; use api_key_env',
    'engine kind unknown': "bad.yaml: engine.kind: Input should be 'vllm' or 'sglang' (got 'tgi')",
    'port out of range': 'bad.yaml: engine.port: Input should be less than or equal to 65535 (got 70000)',
    'model with preset and path': "bad.yaml: engine.model: give exactly one of 'preset' or 'path'",
    'api key as engine flag': 'bad.yaml: engine: args.api-key: secrets come only from the environment; use engine.api_key_env',
    'secret in engine env': 'bad.yaml: engine: env.HF_TOKEN: secrets come only from the environment, never from params',
    'startup timeout negative': 'bad.yaml: engine.startup_timeout_s: Input should be greater than 0 (got -5)',
    'workload typo': "bad.yaml: workload.concurency: unknown key (did you mean 'concurrency'?)",
    'concurrency zero': 'bad.yaml: workload.concurrency[0]: Input should be greater than 0 (got 0)',
    'concurrency empty': 'bad.yaml: workload.concurrency: List should have at least 1 item after validation, not 0',
    'rounds not an int': "bad.yaml: workload.rounds: Input should be a valid integer, unable to parse string as an integer (got 'five')",
    'bucket key typo': "bad.yaml: workload.buckets[0].output_tokens: required key is missing\nbad.yaml: workload.buckets[0].output_token: unknown key (did you mean 'output_tokens'?)",
    'negative output tokens': 'bad.yaml: workload.buckets[0].output_tokens: Input should be greater than 0 (got -8)',
    'api unknown': "bad.yaml: workload.api: Input should be 'chat' or 'completions' (got 'responses')",
    'poisson without rates': "bad.yaml: workload: arrival 'poisson' needs rates_rps (requests per second)",
    'failure budget > 1': 'bad.yaml: workload.failure_budget: Input should be less than or equal to 1 (got 1.5)',
    'slo error rate > 1': 'bad.yaml: slo.error_rate: Input should be less than or equal to 1 (got 2)',
    'duplicate configuration ids': "bad.yaml: <top>: configuration ids must be unique, repeated: ['a']",
    'configuration override typo': "bad.yaml: configurations[0]: engine.portt: unknown key (did you mean 'port'?)",
    'no configurations': 'bad.yaml: configurations: List should have at least 1 item after validation, not 0',
    'configuration id with slash': "bad.yaml: configurations[0].id: String should match pattern '^[A-Za-z0-9][A-Za-z0-9_.-]*$' (got 'a/b')",
    'baseline not an earlier configuration': "bad.yaml: <top>: configurations[0].baseline: 'b' is not an earlier configuration (earlier: [])",
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_malformed_params_error_lines(tmp_path, name):
    p = tmp_path / "bad.yaml"
    p.write_text(yaml.safe_dump(CASES[name], sort_keys=False))
    with pytest.raises(ParamsError) as e:
        load_study(p)
    assert str(e.value).replace(str(p), "bad.yaml") == EXPECTED[name]


def test_there_are_at_least_20_cases():
    assert len(CASES) >= 20 and set(CASES) == set(EXPECTED)


def test_counts_named_tokens_are_not_secrets(tmp_path):
    d = m(["engine", "args", "max-num-batched-tokens"], 4096)
    d["engine"]["env"] = {"VLLM_MAX_TOKENS_PER_STEP": "1"}
    p = tmp_path / "ok.yaml"
    p.write_text(yaml.safe_dump(d))
    assert load_study(p).engine.args["max-num-batched-tokens"] == 4096
