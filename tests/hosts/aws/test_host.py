"""The AWS host wired into the pipeline: start for the first configuration, switch (deploy) for
the next, always stop at the end, also when a configuration fails; the AWS-enforced deadline
cleared after a clean stop and kept when the stop fails; the watchdog tripping mid-benchmark
(fake clock) ends the run as partial with its reason; the dry run of seed 001. The host is a
fake whose engine is the reference server; the boto3 host itself is tested with moto in
tests/hosts/aws/test_ecs.py (deadline included) and tests/hosts/aws/test_stack.py."""

from __future__ import annotations

import contextlib

import pytest
import yaml

from servelab import pipeline, stages
from servelab.hosts.aws import host as aws
from servelab.hosts.aws.base import BotoHost, HostInfo
from servelab.runfolder import read_json, runs_root
from servelab.schema import load_study
from paths import ROOT



DEADLINE = {"utc": "2026-12-01T17:00:00+00:00", "hours": 8.0, "why": "max_hours 8", "region": "us-east-1",
            "asg": "servelab-seed-001-asg", "action": "servelab-deadline"}


class FakeHost:
    calls: list[tuple[str, object]] = []
    url = ""
    fail_stop = False

    def __init__(self, params, kind, *a, **kw):
        self.p, self.kind, self.region, self.started_at = params, kind, None, None
        self.arm_deadline, self.deadline = False, None

    @contextlib.contextmanager
    def watchdog(self, interval_s, sync=None, on_trip=None):
        FakeHost.calls.append(("watchdog on", interval_s))
        yield
        FakeHost.calls.append(("watchdog off", None))

    def start(self, command, env):
        FakeHost.calls.append(("start", command))
        assert self.arm_deadline  # AwsHost asks for the AWS-enforced deadline on every first start
        self.deadline = DEADLINE
        return HostInfo(region=self.p.regions[0], mode=self.kind, url=FakeHost.url, started_at=1.0, deadline=DEADLINE)

    def clear_deadline(self, deadline):
        FakeHost.calls.append(("clear deadline", deadline["asg"]))
        return "deadline cleared"

    def deploy(self, command, env):
        FakeHost.calls.append(("deploy", command))
        return HostInfo(region=self.region, mode=self.kind, url=FakeHost.url, started_at=self.started_at)

    def guard(self):
        FakeHost.calls.append(("guard", self.region))
        return {}

    def stop(self, region=None):
        FakeHost.calls.append(("stop", region))
        if FakeHost.fail_stop:
            raise RuntimeError("ecs:UpdateService throttled")
        return {region: ["stopped"]}


def seed001(tmp_path, **aws_kw):
    """Seed 001's params on the reference server's scale (two configurations, tiny workload),
    its stack replaced by the names of an existing one (FakeHost has no CloudFormation)."""
    d = yaml.safe_load((ROOT / "params" / "seed-001-vllm-g7e.yaml").read_text())
    d["host"]["aws"].pop("stack")
    d["host"]["aws"].update({"cluster": "self-hosted-llm-poc", "service": "self-hosted-llm-poc-deepseek-v4-flash",
                             **aws_kw})
    d["workload"] = {"buckets": [{"input_tokens": 20, "output_tokens": 4}], "concurrency": [1],
                     "warmup_rounds": 0, "rounds": 1}
    d["configurations"] = d["configurations"][:2]
    p = tmp_path / "seed-001-vllm-g7e.yaml"
    p.write_text(yaml.safe_dump(d))
    return load_study(p), p


@pytest.fixture
def aws_env(tmp_path, monkeypatch):
    for k, v in (("AWS_ACCESS_KEY_ID", "AKIATESTPIPELINE0001"), ("AWS_SECRET_ACCESS_KEY", "pipeline-secret-0001")):
        monkeypatch.setenv(k, v)  # AwsHost reads the credentials (the scrub list) before anything starts
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.setenv("SERVELAB_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv("SERVELAB_REPORTS", str(tmp_path / "reports"))


@pytest.fixture
def aws_study(tmp_path, refserver, monkeypatch, aws_env):
    s = refserver(ttft_s=0.005, itl_s=0.001)
    FakeHost.calls, FakeHost.url, FakeHost.fail_stop = [], s.url, False
    monkeypatch.setattr(aws, "make_host", FakeHost)
    return seed001(tmp_path)


def test_start_then_deploy_then_stop(aws_study):
    study, p = aws_study
    assert pipeline.run_study(study, p, notebooks=False, report=False) == 0
    kinds = [c[0] for c in FakeHost.calls]
    # the guard holds for the whole run; the deadline goes once the stop has finished
    assert kinds == ["watchdog on", "start", "guard", "deploy", "watchdog off", "stop", "clear deadline"]
    assert "--enforce-eager" in FakeHost.calls[1][1] and "--enforce-eager" not in FakeHost.calls[3][1]
    root = runs_root() / study.study
    run = read_json(root / study.configurations[0].id / "run.json")
    assert run["status"] == "complete" and run["server"]["aws"]["region"] == study.host.aws.regions[0]
    assert run["server"]["aws"]["deadline"] == DEADLINE  # recorded in run.json ...
    assert read_json(root / study.configurations[0].id / "host.json")["deadline"] == DEADLINE  # ... and host.json
    assert not aws.AwsHost(study, "aws-ecs").state_path().exists()


def test_one_host_and_one_boto_host_serve_the_whole_run(aws_study, monkeypatch):
    """run_study builds the AwsHost once and every configuration's plan (and the stop after
    each) shares it: one boto3 host for start, deploy and stop."""
    study, p = aws_study
    made: list = []
    real = aws.AwsHost.__init__

    def counting(self, *a, **kw):
        made.append(self)
        real(self, *a, **kw)

    monkeypatch.setattr(aws.AwsHost, "__init__", counting)
    boto: list = []
    monkeypatch.setattr(aws, "make_host", lambda *a, **kw: boto.append(FakeHost(*a, **kw)) or boto[-1])
    assert pipeline.run_study(study, p, notebooks=False, report=False) == 0
    assert len(made) == 1 and len(boto) == 1
    assert [c[0] for c in FakeHost.calls] == ["watchdog on", "start", "guard", "deploy", "watchdog off", "stop",
                                              "clear deadline"]


def test_stop_runs_when_a_configuration_fails(aws_study, monkeypatch):
    study, p = aws_study

    def boom(*a, **kw):
        raise RuntimeError("engine did not come up")

    monkeypatch.setattr(stages, "launch", boom)
    assert pipeline.run_study(study, p, notebooks=False, report=False) == 1
    assert [c[0] for c in FakeHost.calls] == ["watchdog on", "start", "watchdog off", "stop", "clear deadline"]


def test_a_failed_stop_keeps_the_deadline_and_the_state(aws_study):
    """The safety net: when the stop itself fails, nothing clears the deadline AWS enforces."""
    study, p = aws_study
    FakeHost.fail_stop = True
    with pytest.raises(RuntimeError, match="throttled"):
        pipeline.run_study(study, p, notebooks=False, report=False)
    assert [c[0] for c in FakeHost.calls][-2:] == ["watchdog off", "stop"]  # no "clear deadline"
    state = read_json(aws.AwsHost(study, "aws-ecs").state_path())
    assert state["deadline"] == DEADLINE  # the next teardown (or servelab aws status) still finds it


def test_aws_run_refuses_unreadable_credentials_before_anything(aws_study, monkeypatch, tmp_path):
    from servelab.secrets import AwsCredentialsError

    study, p = aws_study
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(k, raising=False)
    bad = tmp_path / "credentials"
    bad.write_text("[default\naws_access_key_id = AKIABROKEN0000000000\n")  # unparsable
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(bad))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    with pytest.raises(AwsCredentialsError, match=r"cannot be read \(ConfigParseError"):
        pipeline.run_study(study, p, notebooks=False, report=False)
    assert FakeHost.calls == []  # nothing started, nothing watched


# -- the watchdog trips mid-benchmark (fake clock) -----------------------------------------------
class ClockHost(BotoHost):
    """The real guard() and watchdog thread of the AWS hosts on a fake clock, without boto3:
    starting and stopping only record what they would do."""

    mode = "fake"
    url = ""
    now = [1_000_000.0]
    stops: list[str] = []

    def __init__(self, params, kind, *a, **kw):
        super().__init__(params, lambda region: None, clock=lambda: ClockHost.now[0], sleep=lambda s: None)

    def check_account(self):
        self._account_ok = True
        return "123456789012"

    def start(self, command=None, env=None):
        self.region, self.started_at = self.p.regions[0], self.clock()
        self.deadline = self.deadline_record(self.region)
        return HostInfo(region=self.region, mode=self.mode, url=ClockHost.url, started_at=self.started_at,
                        deadline=self.deadline)

    def deploy(self, command, env=None):
        return HostInfo(region=self.region, mode=self.mode, url=ClockHost.url, started_at=self.started_at)

    def _stop_in(self, region):
        ClockHost.stops.append(region)
        return ["stopped"]


def test_watchdog_stops_the_host_mid_benchmark_and_the_run_ends_partial(tmp_path, refserver, monkeypatch, aws_env):
    srv = refserver(ttft_s=0.005, itl_s=0.02)  # 150 tokens x 20 ms: each request streams ~3 s
    ClockHost.url, ClockHost.now, ClockHost.stops = srv.url, [1_000_000.0], []
    monkeypatch.setattr(aws, "make_host", ClockHost)
    monkeypatch.setattr(aws.AwsHost, "watchdog_interval_s", 0.05)
    study, p = seed001(tmp_path, hourly_usd=8.2861)
    d = yaml.safe_load(p.read_text())
    d["workload"] = {"buckets": [{"input_tokens": 20, "output_tokens": 150}], "concurrency": [1],
                     "warmup_rounds": 0, "rounds": 20}  # ~60 s if nothing stopped it
    d["configurations"] = d["configurations"][:1]
    p.write_text(yaml.safe_dump(d))
    study = load_study(p)
    records = runs_root() / study.study / "eager" / "records.jsonl"

    def nine_hours_later():  # once the benchmark has written a record, 9 hours pass on the host's clock
        deadline = _time.monotonic() + 30
        while _time.monotonic() < deadline and not (records.exists() and records.read_text().count("\n") >= 1):
            _time.sleep(0.01)
        ClockHost.now[0] += 9 * 3600

    import threading
    import time as _time

    threading.Thread(target=nine_hours_later, daemon=True).start()
    t0 = _time.monotonic()
    assert pipeline.run_study(study, p, notebooks=False, report=False) == 1
    assert _time.monotonic() - t0 < 30  # ended by the guard, not by the workload (~60 s)
    assert ClockHost.stops[0] == study.host.aws.regions[0]  # the watchdog thread stopped the host
    run = read_json(runs_root() / study.study / "eager" / "run.json")
    assert run["status"] == "partial"
    assert run["guard_tripped"] == "ran 9.00 h >= max_hours 8: host in us-east-1 stopped"
    assert run["message"].startswith("stopped by the AWS guard (ran 9.00 h >= max_hours 8: host in us-east-1 "
                                     "stopped); interrupted by SIGTERM during level ")
    assert 0 < run["records"] < 20  # the records measured before the trip are kept
    assert run["server"]["aws"]["deadline"]["hours"] == 8.0  # the deadline it armed: max_hours < 150 USD / 8.2861
    assert not aws.AwsHost(study, "aws-ecs").state_path().exists()


def test_replayed_managed_endpoint_gets_a_cost_row(refserver, tmp_path, monkeypatch):
    """host.kind attach + cost.replay_price: the write-up prices the measured tokens."""
    from servelab import report
    from servelab.analysis.cost import managed_cost
    from servelab.prices import resolve_managed

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
    from servelab.report.money import cost_rows, cost_section

    text, _html = cost_section(sd)
    t, kind = cost_rows(sd)
    assert kind == "replay"
    price = resolve_managed(["atlas/deepseek-v4.1-flash"])["atlas/deepseek-v4.1-flash"]
    assert "Atlas" in text or "atlas" in text
    row = t.iloc[0]
    assert row["ok"] == 4 and row["usd"] == pytest.approx(round(4 * managed_cost(40, 8, price), 4), abs=1e-4)
    assert 4 * (40 * 0.30 + 8 * 1.20) / 1e6 == pytest.approx(row["usd"], abs=1e-4)  # by hand: $0.30 in, $1.20 out


# -- the dry run of seed 001 -------------------------------------------------------------------
def test_seed001_dry_run_prints_stack_commands_deadline_and_cost(monkeypatch):
    import shlex

    import boto3

    def no_aws(*a, **k):
        raise AssertionError("a dry run must not call AWS")

    monkeypatch.setattr(boto3, "Session", no_aws)
    monkeypatch.setattr(boto3, "client", no_aws)
    study = load_study(ROOT / "params" / "seed-001-vllm-g7e.yaml")
    lines = pipeline.describe(study).splitlines()
    # the stack to create, its resources and hourly cost (stack.plan)
    assert ("aws: stack servelab-seed-001 in us-east-1: create or update from templates/ecs-gpu-stack.yaml "
            "(CloudFormation, 34 resources); parameters InstanceType=g7e.12xlarge GpuCount=2 "
            "EngineImage=vllm/vllm-openai:v0.26.0 RootVolumeGiB=300") in lines
    resources = [ln for ln in lines if ln.startswith("aws: stack resource ")]
    assert len(resources) == 34 and "aws: stack resource NatGateway AWS::EC2::NatGateway" in resources
    assert "aws: stack resource AutoScalingGroup AWS::AutoScaling::AutoScalingGroup" in resources
    assert ("aws: stack hourly idle (service 0): 0.0805 USD/h (NAT gateway 0.0450 + public IPv4 (NAT's Elastic IP) "
            "0.0050 + internal ALB 0.0225 + ALB LCUs (1) 0.0080)") in lines
    assert ("aws: stack hourly running (1 x g7e.12xlarge): 8.3995 USD/h (NAT gateway 0.0450 + public IPv4 (NAT's "
            "Elastic IP) 0.0050 + internal ALB 0.0225 + ALB LCUs (1) 0.0080 + gp3 root volume (300 GiB) 0.0329 + "
            "GPU instance (On-Demand) 8.2861)") in lines
    assert ("aws: ecs-service <stack servelab-seed-001's ClusterName>/<stack servelab-seed-001's ServiceName>, "
            "g7e.12xlarge; regions in order us-east-1 (the stack's region)") in lines
    # every launch command, shell-quoted (the JSON flags in single quotes)
    launch = [ln for ln in lines if "] launch: " in ln]
    assert [ln.split("]")[0][1:] for ln in launch] == [c.id for c in study.configurations]
    mtp = shlex.split(launch[-1].split("launch: ", 1)[1])
    assert mtp[mtp.index("--compilation-config") + 1] == (
        '{"mode":0,"cudagraph_mode":"FULL_DECODE_ONLY","cudagraph_capture_sizes":[1,2,4,8]}')
    assert mtp[mtp.index("--speculative-config") + 1] == '{"method":"mtp","num_speculative_tokens":1}'
    assert launch[0].endswith(" --trust-remote-code --enforce-eager")
    # the deadline AWS enforces
    assert ("aws: deadline: before the service scales out, autoscaling:PutScheduledUpdateGroupAction "
            "servelab-deadline on the group (min/max/desired 0) at start + 8.00 h (max_hours 8; max_spend_usd 150 "
            "at 8.2861 USD/h = 18.1 h; the earlier), tag servelab:deadline; AWS stops the GPU even if servelab dies "
            "mid-benchmark; recorded in host.json and run.json; cleared after a clean stop, kept on every failure "
            "path") in lines
    # the estimated cost, and the seed's table beside it
    assert "cost: guard stops the host after 8 h (= $66.29) or $150.00 (= 18.1 h), whichever comes first" in lines
    assert any(ln.startswith("cost: estimated run: 6 configurations, ~86 min of host time = ~$11.89") for ln in lines)
    assert "cost:   itemised $6,131.62; not itemised by the seed: $2,755.38 (31.0% of its $8,887.00)" in lines
    assert ("cost: AWS / Fireworks at seed 001's cuda-graph c=4 297.09 tok/s (254-token prompts): at its "
            "$8,887.00/month 12.96x (seed 001 published: 2.2-10.7x); at the itemised $6,131.62 8.94x "
            "(seed 001 published: 2.2-10.7x)") in lines
    assert ("cost: AWS / Fireworks at seed 001's mtp1 c=4 358.4 tok/s (254-token prompts): at its $8,887.00/month "
            "10.74x (seed 001 published: 2.2-10.7x); at the itemised $6,131.62 7.41x (seed 001 published: "
            "2.2-10.7x)") in lines
    # the order a reader needs: stack, commands, deadline, cost
    first = {k: next(i for i, ln in enumerate(lines) if ln.startswith(k)) for k in
             ("[eager] launch", "aws: stack ", "aws: deadline", "cost: ")}
    assert first["[eager] launch"] < first["aws: stack "] < first["aws: deadline"] < first["cost: "]
