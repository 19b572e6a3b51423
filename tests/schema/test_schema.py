"""Params validation: every params file loads; bad input names file, key and expectation."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from servelab.schema import ParamsError, load_study
from paths import ROOT

PARAMS = sorted((ROOT / "params").glob("*.yaml"))
BASE = yaml.safe_load((ROOT / "params" / "local-cpu-kv.yaml").read_text())


@pytest.mark.parametrize("path", PARAMS, ids=[p.name for p in PARAMS])
def test_every_params_file_validates(path):
    s = load_study(path)
    assert s.configurations and s.study == path.stem


def _write(tmp_path, data) -> Path:
    p = tmp_path / "bad.yaml"
    p.write_text(yaml.safe_dump(data) if not isinstance(data, str) else data)
    return p


def _err(tmp_path, data) -> str:
    with pytest.raises(ParamsError) as e:
        load_study(_write(tmp_path, data))
    return str(e.value)


def test_unknown_key_suggests_spelling(tmp_path):
    d = {**BASE, "workload": {**BASE["workload"], "concurency": [1]}}
    msg = _err(tmp_path, d)
    assert msg == f"{tmp_path / 'bad.yaml'}: workload.concurency: unknown key (did you mean 'concurrency'?)"


def test_wrong_type_names_key(tmp_path):
    d = {**BASE, "workload": {**BASE["workload"], "rounds": "five"}}
    msg = _err(tmp_path, d)
    assert "bad.yaml: workload.rounds: Input should be a valid integer" in msg and "'five'" in msg


def test_nested_list_key_path(tmp_path):
    d = {**BASE, "workload": {**BASE["workload"], "buckets": [{"input_tokens": 10, "output_token": 5}]}}
    msg = _err(tmp_path, d)
    assert "workload.buckets[0].output_token: unknown key (did you mean 'output_tokens'?)" in msg
    assert "workload.buckets[0].output_tokens: required key is missing" in msg


def test_bad_override_and_duplicate_ids(tmp_path):
    d = {**BASE, "configurations": [{"id": "a"}, {"id": "a"}]}
    assert "configuration ids must be unique" in _err(tmp_path, d)
    d = {**BASE, "configurations": [{"id": "a", "engine": {"portt": 1}}]}
    assert "portt" in _err(tmp_path, d)


def test_not_yaml_and_not_mapping(tmp_path):
    assert "not valid YAML" in _err(tmp_path, "a: [1, 2\n")
    assert "expected a mapping" in _err(tmp_path, "- 1\n- 2\n")


def _cli(*args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "servelab.cli", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=120, env=env)


def test_cli_unknown_key_stops_before_work(tmp_path):
    d = {**BASE, "study": "bad-study", "engine": {**BASE["engine"], "prot": 1}}
    p = _write(tmp_path, d)
    r = _cli("run", str(p), "--no-report")
    assert r.returncode == 2
    assert r.stderr.strip() == f"{p}: engine.prot: unknown key (did you mean 'port'?)"
    assert not (ROOT / "runs" / "bad-study").exists()


def test_cli_unreachable_url_stops_before_work(tmp_path):
    d = {**BASE, "study": "bad-url", "host": {"kind": "attach", "attach": {"url": "http://127.0.0.1:9"}}}
    d["configurations"] = [{**c, "url": "http://127.0.0.1:9"} for c in BASE["configurations"]]  # each its own server
    p = _write(tmp_path, d)
    r = _cli("run", str(p), "--no-report")
    assert r.returncode == 1
    assert "cannot reach http://127.0.0.1:9/v1/models" in r.stderr
    # one error line; the lines before it are preflight warnings (kv-tight overflows its cache on purpose)
    lines = r.stderr.strip().splitlines()
    assert len([ln for ln in lines if ": warning: " not in ln]) == 1 and "warning" in lines[0]
    assert not (ROOT / "runs" / "bad-url").exists()


def test_cli_dry_run_prints_commands():
    r = _cli("run", "params/local-cpu-kv.yaml", "--dry-run")
    assert r.returncode == 0
    assert "--num-gpu-blocks-override 136" in r.stdout and "--enforce-eager" in r.stdout


def test_format_version_decides_the_upgrade(tmp_path):
    """study.json / run.json carry format_version 3; a file without one is servelab 0.1's shape
    (every host kind's block, aws.mode), version 2 had `run_noise_pct`: both still readable; a
    newer format is refused."""
    import json

    from servelab.runfolder import RUN_JSON, RunFolder
    from servelab.schema import FORMAT_VERSION, ParamsError, upgrade

    assert FORMAT_VERSION == 3
    old = {"study": "s", "host": {"kind": "aws-ecs", "attach": None, "aws": {"mode": "ecs-service", "cluster": "c"}}}
    assert upgrade(old) == {"study": "s", "host": {"kind": "aws-ecs", "aws": {"cluster": "c"}}}
    assert upgrade({"study": "s", "run_noise_pct": 18.6}, 2) == {"study": "s"}  # no longer an estimate of anything
    assert upgrade(old, 3) is old  # the current format is taken as it is
    with pytest.raises(ParamsError, match="format_version 4 is newer"):
        upgrade(old, 4)
    RunFolder(tmp_path).write_run({"status": "running"})
    assert list(json.loads((tmp_path / RUN_JSON).read_text()).items()) == [("format_version", 3), ("status", "running")]
    for sj in sorted(ROOT.glob("reports/*/data/study.json")):  # older ones carry no version: all still load
        data = json.loads(sj.read_text())
        assert data.get("format_version") in (None, 2, FORMAT_VERSION)
        from servelab.schema import study_from_dict

        assert study_from_dict(upgrade(data["study"], data.get("format_version"))).study == sj.parent.parent.name
