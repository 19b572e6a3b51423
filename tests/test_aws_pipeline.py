"""The AWS host wired into the pipeline: start for the first configuration, switch (deploy) for
the next, always stop at the end, also when a configuration fails. The host is a fake whose
engine is the reference server; the boto3 host itself is tested with moto in test_aws.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from servelab import aws, pipeline, stages
from servelab.aws import HostInfo
from servelab.config import load_study

ROOT = Path(__file__).resolve().parents[1]


class FakeHost:
    calls: list[tuple[str, object]] = []
    url = ""

    def __init__(self, params, *a, **kw):
        self.p, self.region, self.started_at = params, None, None

    def start(self, command, env):
        FakeHost.calls.append(("start", command))
        return HostInfo(region=self.p.regions[0], mode=self.p.mode, url=FakeHost.url, started_at=1.0)

    def deploy(self, command, env):
        FakeHost.calls.append(("deploy", command))
        return HostInfo(region=self.region, mode=self.p.mode, url=FakeHost.url, started_at=self.started_at)

    def guard(self):
        FakeHost.calls.append(("guard", self.region))
        return {}

    def stop(self, region=None):
        FakeHost.calls.append(("stop", region))
        return {region: ["stopped"]}


@pytest.fixture
def aws_study(tmp_path, refserver, monkeypatch):
    s = refserver(ttft_s=0.005, itl_s=0.001)
    FakeHost.calls, FakeHost.url = [], s.url
    monkeypatch.setattr(aws, "make_host", FakeHost)
    monkeypatch.setenv("SERVELAB_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv("SERVELAB_REPORTS", str(tmp_path / "reports"))
    d = yaml.safe_load((ROOT / "params" / "seed-001-vllm-g7e.yaml").read_text())
    d["workload"] = {"buckets": [{"input_tokens": 20, "output_tokens": 4}], "concurrency": [1],
                     "warmup_rounds": 0, "rounds": 1}
    d["configurations"] = d["configurations"][:2]
    p = tmp_path / "seed-001-vllm-g7e.yaml"
    p.write_text(yaml.safe_dump(d))
    return load_study(p), p


def test_start_then_deploy_then_stop(aws_study):
    study, p = aws_study
    assert pipeline.run_study(study, p, notebooks=False, report=False) == 0
    kinds = [c[0] for c in FakeHost.calls]
    assert kinds == ["start", "guard", "deploy", "stop"]
    assert "--enforce-eager" in FakeHost.calls[0][1] and "--enforce-eager" not in FakeHost.calls[2][1]
    run = stages.read_json(stages.runs_root() / study.study / study.configurations[0].id / "run.json")
    assert run["status"] == "complete" and run["server"]["aws"]["region"] == study.host.aws.regions[0]
    assert not stages.aws_state_path(study).exists()


def test_stop_runs_when_a_configuration_fails(aws_study, monkeypatch):
    study, p = aws_study

    def boom(*a, **kw):
        raise RuntimeError("engine did not come up")

    monkeypatch.setattr(stages, "launch", boom)
    assert pipeline.run_study(study, p, notebooks=False, report=False) == 1
    assert [c[0] for c in FakeHost.calls] == ["start", "stop"]


def test_replayed_managed_endpoint_gets_a_cost_row(refserver, tmp_path, monkeypatch):
    """host.kind attach + cost.replay_price: the write-up prices the measured tokens."""
    from servelab import report
    from servelab.cost import managed_cost, resolve_managed

    s = refserver(ttft_s=0.005, itl_s=0.001)
    monkeypatch.setenv("SERVELAB_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv("SERVELAB_REPORTS", str(tmp_path / "reports"))
    d = {"study": "replay", "title": "managed replay", "host": {"kind": "attach", "attach": {"url": s.url}},
         "workload": {"buckets": [{"input_tokens": 40, "output_tokens": 8}], "concurrency": [2],
                      "warmup_rounds": 0, "rounds": 2},
         "cost": {"replay_price": "atlas/deepseek-v4.1-flash"}, "configurations": [{"id": "atlas"}]}
    p = tmp_path / "replay.yaml"
    p.write_text(yaml.safe_dump(d))
    assert pipeline.run_study(load_study(p), p, notebooks=False, report=False) == 0
    sd = report.load_study_data(tmp_path / "runs" / "replay")
    text, t = report.cost_section(sd)
    price = resolve_managed(["atlas/deepseek-v4.1-flash"])["atlas/deepseek-v4.1-flash"]
    assert "Atlas" in text or "atlas" in text
    row = t.iloc[0]
    assert row["ok"] == 4 and row["usd"] == pytest.approx(round(4 * managed_cost(40, 8, price), 4), abs=1e-4)
    assert 4 * (40 * 0.30 + 8 * 1.20) / 1e6 == pytest.approx(row["usd"], abs=1e-4)  # by hand: $0.30 in, $1.20 out
