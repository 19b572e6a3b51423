"""`host.aws.runner: instance`: `servelab run` on the rented GPU instance itself, with moto's S3, EC2 and SSM.

The instance is simulated where AWS would run its user data: between two polls the test reads the user data
moto stored, runs the `servelab run` it names on the params it finds in S3 (this machine standing in for the
instance: SERVELAB_GPUS and a stand-in engine, as tests/test_gpu_runner.py does), and writes the log, the runs
and the exit status where the script would. What is checked: what goes up (this servelab's wheel, the params
on `host: local`), the boot script (valid shell, the dead-man shutdown, secrets from SSM only), the runs
unpacked here and this machine's study.json kept, the instance terminated after the run and after a failure,
and an instance that ends without an exit status."""

from __future__ import annotations

import base64
import io
import re
import shlex
import subprocess
import tarfile

import boto3
import pytest
import yaml
from moto import mock_aws

from conftest import free_ports
from servelab.cli import main
from servelab.hosts.aws import host as aws_host
from servelab.hosts.aws.errors import AwsHostError
from servelab.hosts.aws.remote import InstanceRunnerHost, instance_params
from servelab.runfolder import RunFolder, read_json
from test_gpu_runner import FAKE

REGION, BUCKET, AMI = "eu-west-2", "servelab-results-test", "/servelab/test/gpu-ami"


@pytest.fixture
def cloud(monkeypatch, tmp_path):
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_SESSION_TOKEN": "testing",
                 "AWS_DEFAULT_REGION": REGION}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.setenv("SERVELAB_AWS_ACCOUNT_ID", "123456789012")  # moto's account
    monkeypatch.setenv("SERVELAB_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv("SERVELAB_REPORTS", str(tmp_path / "reports"))
    with mock_aws():
        boto3.client("ssm", region_name=REGION).put_parameter(Name=AMI, Value="ami-0123456789abcdef0", Type="String")
        boto3.client("s3", region_name=REGION).create_bucket(
            Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": REGION})
        yield


@pytest.fixture
def study(tmp_path):
    """Two configurations of one engine and one of another, on a GPU instance whose runner is the instance."""
    fake = tmp_path / "enginepy"
    fake.write_text(FAKE)
    fake.chmod(0o755)
    data = {"study": "remote-runner", "title": "t",
            "engine": {"kind": "vllm", "model": {"preset": "cpu-tiny"}, "port": free_ports(2), "python": str(fake),
                       "startup_timeout_s": 60, "args": {"gpu-memory-utilization": 0.3}},
            "workload": {"api": "completions", "buckets": [{"input_tokens": 16, "output_tokens": 8}],
                         "concurrency": [1], "warmup_rounds": 0, "rounds": 1},
            "quality": {"enabled": False},
            "host": {"kind": "aws-instance", "aws": {
                "regions": [REGION], "instance_type": "g7e.12xlarge", "image": "vllm/vllm-openai:v0.26.0",
                "max_hours": 2, "hourly_usd": 1.86, "poll_s": 0.01, "name": "remote-test", "ami_parameter": AMI,
                "runner": "instance", "results_bucket": BUCKET,
                "secret_parameters": {"HF_TOKEN": "/servelab/hf-token"}}},
            "configurations": [{"id": "a"}, {"id": "b", "workload": {"concurrency": [2]}},
                               {"id": "c", "engine": {"args": {"max-num-seqs": 8}}}]}
    params = tmp_path / "remote-runner.yaml"
    params.write_text(yaml.safe_dump(data))
    return params


def _user_data(iid: str) -> str:
    attr = boto3.client("ec2", region_name=REGION).describe_instance_attribute(InstanceId=iid, Attribute="userData")
    return base64.b64decode(attr["UserData"]["Value"]).decode()


def _instance(monkeypatch, tmp_path, *, finish: bool = True):
    """On the runner's first poll, do what the instance's user data does (module docstring); `finish`: else the
    instance terminates without writing anything."""
    seen: dict = {}
    made = aws_host.make_host

    def make(params, kind, *a, **kw):
        h = made(params, kind, *a, **kw)
        real_sleep = h.sleep

        def sleep(s):
            if not seen:
                seen["prefix"] = prefix = h.prefix
                iid = h._find(REGION)[0]["InstanceId"]  # noqa: SLF001 - the tagged instance, as stop finds it
                ud = seen["user_data"] = _user_data(iid)
                s3 = boto3.client("s3", region_name=REGION)
                seen["inputs"] = sorted(o["Key"].rsplit("/", 1)[1] for o in s3.list_objects_v2(
                    Bucket=BUCKET, Prefix=f"{prefix}/input/")["Contents"])
                seen["params"] = s3.get_object(Bucket=BUCKET, Key=f"{prefix}/input/params.yaml")["Body"].read()
                if finish:
                    seen["rc"] = _run_as_the_instance(ud, seen["params"], tmp_path / "instance", monkeypatch)
                    _upload_like_the_script(s3, prefix, tmp_path / "instance", seen["rc"])
                else:
                    boto3.client("ec2", region_name=REGION).terminate_instances(InstanceIds=[iid])
            real_sleep(min(s, 0.01))

        h.sleep = sleep
        return h

    monkeypatch.setattr(aws_host, "make_host", make)
    return seen


def _run_as_the_instance(user_data: str, params: bytes, work, monkeypatch) -> int:
    """The `servelab run` of the user data, on the params from S3, with runs under work/runs."""
    argv = shlex.split(re.search(r"exec (python3 -m servelab\.cli run [^']*)", user_data).group(1))
    work.mkdir()
    (work / "params.yaml").write_bytes(params)
    with monkeypatch.context() as m:
        m.chdir(work)
        m.setenv("SERVELAB_RUNS", str(work / "runs"))
        m.setenv("SERVELAB_GPUS", "1xH100")
        return main(argv[3:])


def _upload_like_the_script(s3, prefix: str, work, rc: int) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(work / "runs", arcname="runs")
        evil = tarfile.TarInfo("runs/../../escaped.txt")  # never written outside runs/<study>/
        evil.size = 1
        tar.addfile(evil, io.BytesIO(b"x"))
    s3.put_object(Bucket=BUCKET, Key=f"{prefix}/runs.tgz", Body=buf.getvalue())
    s3.put_object(Bucket=BUCKET, Key=f"{prefix}/run.log", Body=b"[servelab] measured 3 configuration(s)\n")
    s3.put_object(Bucket=BUCKET, Key=f"{prefix}/exit", Body=f"{rc}\n".encode())


def test_the_instance_runs_the_study_runner_and_its_runs_come_back(cloud, study, tmp_path, monkeypatch, capfd):
    seen = _instance(monkeypatch, tmp_path)
    rc = main(["run", str(study), "--no-report", "--no-notebooks"])
    err = capfd.readouterr().err
    assert rc == 0, err[-3000:]
    # what went up: this servelab as a wheel, and the study on host: local
    assert [n for n in seen["inputs"] if n.endswith(".whl")][0].startswith("servelab-") and "params.yaml" in seen["inputs"]
    up = yaml.safe_load(seen["params"])
    assert up["host"] == {"kind": "local"} and [c["id"] for c in up["configurations"]] == ["a", "b", "c"]
    # the boot script: valid shell, the instance's own deadline, secrets from SSM, the runner in the engine image
    ud = seen["user_data"]
    assert subprocess.run(["bash", "-n"], input=ud, text=True).returncode == 0
    assert "shutdown -h +120" in ud and "shutdown -h now" in ud
    assert "export HF_TOKEN=$(aws ssm get-parameter --region eu-west-2 --with-decryption" in ud and " -e HF_TOKEN " in ud
    assert "--gpus all" in ud and "--entrypoint bash vllm/vllm-openai:v0.26.0" in ud
    assert "servelab.cli run params.yaml --no-report --no-notebooks --config a,b,c" in ud
    # the instance's runner placed the engines on its GPU: a and b on one server, c on its own
    root = tmp_path / "runs" / "remote-runner"
    assert [RunFolder(root / c).run["status"] for c in "abc"] == ["complete"] * 3
    design = read_json(root / "design.json")
    assert design["placement"]["servers"]["a"]["configs"] == ["a", "b"]
    assert read_json(root / "study.json")["params_path"] == str(study)  # this machine's, not the instance's
    assert not (tmp_path / "escaped.txt").exists() and not (tmp_path / "runs" / "escaped.txt").exists()
    assert "instance: [servelab] measured 3 configuration(s)" in err and "runs brought back: a, b, c" in err
    ec2 = boto3.client("ec2", region_name=REGION)
    states = [i["State"]["Name"] for r in ec2.describe_instances()["Reservations"] for i in r["Instances"]]
    assert states == ["terminated"]


def test_an_instance_that_ends_without_an_exit_status_is_an_error_and_is_terminated(cloud, study, tmp_path,
                                                                                  monkeypatch, capfd):
    _instance(monkeypatch, tmp_path, finish=False)
    rc = main(["run", str(study), "--no-report", "--no-notebooks"])
    err = capfd.readouterr().err
    assert rc != 0 and "ended (terminated" in err and "before the study did" in err
    assert not (tmp_path / "runs" / "remote-runner" / "aws-instance-host.json").exists()  # torn down


def test_a_model_directory_of_this_machine_is_refused(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump({"engine": {"model": {"path": "/data/llama"}}, "configurations": [{"id": "a"}],
                                 "host": {"kind": "aws-instance"}}))
    with pytest.raises(AwsHostError, match="/data/llama is a directory of this machine"):
        instance_params(p)


def test_the_dry_run_plans_the_runner_on_the_instance(study, capfd):
    assert main(["run", str(study), "--dry-run"]) == 0
    out = capfd.readouterr().out
    assert "servelab's wheel and the params (host: local) to s3://servelab-results-test/" in out
    assert "ec2:RunInstances g7e.12xlarge once (user data: `servelab run` in vllm/vllm-openai:v0.26.0" in out
    assert "tunnel" not in out.split("aws:", 1)[1]
    # placed on the instance type's GPUs (2 in the price table), predicted for that GPU, not this machine's
    assert "placement: 2 x RTX PRO 6000 Blackwell Server Edition (the instance type's, from the price table)" in out
    assert "server a on GPU 0" in out and "a, b" in out
    assert "predicted on RTX PRO 6000 Blackwell Server Edition" in out


def test_runner_instance_needs_a_bucket_an_image_and_aws_instance():
    from servelab.schema import AwsParams

    with pytest.raises(ValueError, match="runner: instance needs results_bucket"):
        AwsParams(regions=[REGION], instance_type="g6e.xlarge", max_hours=1, runner="instance")
    p = AwsParams(regions=[REGION], instance_type="g6e.xlarge", max_hours=1, runner="instance",
                  results_bucket=BUCKET, image="vllm/vllm-openai:v0.26.0")
    with pytest.raises(AwsHostError, match="needs host.kind aws-instance"):
        aws_host.make_host(p, "aws-ecs")
    assert isinstance(aws_host.make_host(p, "aws-instance"), InstanceRunnerHost)
