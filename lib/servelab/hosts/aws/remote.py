"""`host.aws.runner: instance` (host.kind aws-instance): the study runner on the rented GPU instance itself.

The same `servelab run` a GPU machine of the user's own runs (NVML placement on the instance's GPUs, one server
per engine, peers, checks, `--stop-after`), started by the instance's user data inside the engine image:
this servelab as a wheel and the study's params (on `host: local` there) go up to `host.aws.results_bucket`;
the instance installs the wheel, runs the study, sends its log every 30 s and its runs at the end, then shuts
itself down (terminate on shutdown; the dead-man `shutdown -h` of max_hours stays). Here the log is followed,
the spend/time guard runs, and the runs are unpacked into runs/<study>/ to be published as any study's.
Nothing runs through the port forward."""

from __future__ import annotations

import io
import shlex
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from ...paths import project_root
from .base import err_code
from .errors import AwsHostError
from .instance import SingleInstanceHost

WORK = "/var/lib/servelab"  # on the instance: inputs, the run's log, runs/
INPUT, LOG, EXIT, RUNS = "input", "run.log", "exit", "runs.tgz"
#: what the engine image lacks for the runner: NVML for the placement, gguf/accelerate for the real-weights preset
RUNNER_EXTRAS = ("nvidia-ml-py>=12", "gguf>=0.17", "accelerate>=1.0")
#: the study-level files kept from this machine's run folder (the instance's name its params path there)
LOCAL_FILES = ("study.json", "params.yaml")


def instance_params(params_path: Path) -> str:
    """The study's params as the instance runs them: the same study with `host: local` (the instance is the
    machine). A configuration whose model is a local directory of this machine is refused: it is not there."""
    d = yaml.safe_load(Path(params_path).read_text())
    engines = [d.get("engine") or {}] + [c.get("engine") or {} for c in d.get("configurations") or []]
    paths = [e["model"]["path"] for e in engines if isinstance(e.get("model"), dict) and e["model"].get("path")]
    if paths:
        raise AwsHostError(f"runner: instance: engine.model.path {paths[0]} is a directory of this machine, not of "
                           "the instance: name a preset or a model on the hub")
    d["host"] = {"kind": "local"}
    return yaml.safe_dump(d, sort_keys=False, allow_unicode=True)


def servelab_wheel(out: Path) -> Path:
    """This servelab as a wheel (`pip wheel` of the checkout it is installed from): the instance runs the code
    that planned the study here."""
    import servelab

    root = project_root(Path(servelab.__file__).parent, default=None)
    if root is None:
        raise AwsHostError("runner: instance builds servelab's wheel from its checkout; this servelab is not "
                           "installed from one (pip install -e the checkout)")
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                        str(out), str(root)], capture_output=True, text=True, check=False)
    wheels = sorted(out.glob("servelab-*.whl"))
    if r.returncode or not wheels:
        raise AwsHostError(f"could not build servelab's wheel for the instance: {(r.stderr or r.stdout)[-400:]}")
    return wheels[-1]


def runner_argv(configs: Sequence[str], *, reduced: bool, stop_after_s: float | None, force: bool) -> list[str]:
    """The `servelab run` the instance runs (its measurements only: the page is published here)."""
    argv = ["python3", "-m", "servelab.cli", "run", "params.yaml", "--no-report", "--no-notebooks",
            "--config", ",".join(configs)]
    return (argv + (["--reduced"] if reduced else []) + (["--force"] if force else [])
            + (["--stop-after", f"{stop_after_s:g}"] if stop_after_s else []))


class InstanceRunnerHost(SingleInstanceHost):
    """One GPU instance whose user data runs the study runner in the engine image (module docstring)."""

    mode = "single-instance, study runner on the instance"
    prefix = ""  # s3 key prefix of this run (set by `upload`)

    def s3(self) -> Any:
        return self.client(self.p.regions[0], "s3")

    @property
    def url(self) -> str:
        return f"s3://{self.p.results_bucket}/{self.prefix}"

    def upload(self, study_id: str, params_path: Path) -> None:
        """The wheel and the params (host: local) under s3://results_bucket/servelab/<study>/<utc time>/input/."""
        self.prefix = f"servelab/{study_id}/{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime(self.clock()))}"
        params = instance_params(params_path)
        with tempfile.TemporaryDirectory() as tmp:
            wheel = servelab_wheel(Path(tmp))
            self.s3().upload_file(str(wheel), self.p.results_bucket, f"{self.prefix}/{INPUT}/{wheel.name}")
        self.s3().put_object(Bucket=self.p.results_bucket, Key=f"{self.prefix}/{INPUT}/params.yaml",
                             Body=params.encode())
        self.log(f"inputs: {self.url}/{INPUT}/ (servelab {wheel.name}, params.yaml on host: local)")

    def user_data(self, command: list[str], env: dict[str, str], region: str) -> str:
        """Boot script: the dead-man shutdown, the inputs from S3, `servelab run` in the engine image with every
        GPU, the log to S3 every 30 s, the runs and the exit status to S3 at the end, then shutdown."""
        q = shlex.quote
        lines = self.boot_lines(env, region, ["#!/bin/bash",
                                              "# servelab: the study runner on this instance; its log and runs go to S3",
                                              "set -uo pipefail"])  # no -e: a failed run still sends what it has
        lines += [f"W={WORK}", f"S3={q(self.url)}", 'mkdir -p "$W" /var/lib/llm-model-cache',
                  f'aws s3 cp --quiet --recursive "$S3/{INPUT}/" "$W/" || {{ echo 2 > "$W/{EXIT}"; }}',
                  f'( while sleep 30; do aws s3 cp --quiet "$W/{LOG}" "$S3/{LOG}"; done ) &', "SYNC=$!"]
        lines += self.secret_exports(region)
        install = "python3 -m pip install -q /work/servelab-*.whl " + " ".join(q(r) for r in RUNNER_EXTRAS)
        inner = f"{install} && exec {shlex.join(command)}"
        words = [q(w) for w in ["docker", "run", "--rm", "--name", "servelab-runner", "--gpus", "all", "--ipc=host",
                                "--ulimit", "memlock=-1:-1", "-v", f"{WORK}:/work", "-v",
                                "/var/lib/llm-model-cache:/root/.cache", "-w", "/work", "-e", "SERVELAB_RUNS=/work/runs"]]
        words += self.env_words(env)
        words += [q(w) for w in ["--entrypoint", "bash", str(self.p.image), "-c", inner]]
        lines += [f'[ -f "$W/{EXIT}" ] || {{ ' + " ".join(words) + f' > "$W/{LOG}" 2>&1; echo $? > "$W/{EXIT}"; }}',
                  "kill $SYNC 2>/dev/null",
                  f'tar czf "$W/{RUNS}" -C "$W" runs 2>/dev/null',
                  f'aws s3 cp --quiet "$W/{RUNS}" "$S3/{RUNS}"; aws s3 cp --quiet "$W/{LOG}" "$S3/{LOG}"',
                  f'aws s3 cp --quiet "$W/{EXIT}" "$S3/{EXIT}"',
                  "shutdown -h now"]
        return "\n".join(lines) + "\n"

    # -- following the run from here -----------------------------------------------------------
    def _object(self, name: str) -> bytes | None:
        try:
            return self.s3().get_object(Bucket=self.p.results_bucket, Key=f"{self.prefix}/{name}")["Body"].read()
        except Exception as e:  # noqa: BLE001 - botocore's ClientError, read by its code
            if err_code(e) in ("NoSuchKey", "404"):  # not written yet
                return None
            raise

    def _ended(self, region: str, iid: str) -> str | None:
        res = self.client(region, "ec2").describe_instances(InstanceIds=[iid])["Reservations"]
        inst = res[0]["Instances"][0]
        state = inst["State"]["Name"]
        return f"{state} ({inst.get('StateReason', {}).get('Message', '')})" \
            if state in ("shutting-down", "terminated", "stopping", "stopped") else None

    def follow(self, iid: str, say: Callable[[str], None], guard: Callable[[], Any]) -> int:
        """Wait for the instance's exit status, printing its new log lines and running the guard between
        polls; its exit status (0 measured everything, 3 --stop-after left some, 1 a failure, 2 refused).
        AwsHostError when the instance ended without one."""
        shown, grace = 0, None
        while True:
            log = (self._object(LOG) or b"").decode(errors="replace").splitlines()
            for line in log[shown:]:
                say(f"instance: {line}")
            shown = max(shown, len(log))
            code = self._object(EXIT)
            if code is not None:
                return int(code.decode().strip() or 1)
            ended = self._ended(self.region or self.p.regions[0], iid)
            if ended:  # its last uploads may still be on their way: one more poll
                if grace is not None:
                    raise AwsHostError(f"the instance {iid} ended ({ended}) before the study did; its log: "
                                       f"{self.url}/{LOG}")
                grace = ended
            guard()
            self.sleep(self.p.poll_s)

    def fetch_runs(self, root: Path) -> list[str]:
        """The instance's runs/<study>/ unpacked into `root` (this machine's study.json and params.yaml kept);
        the names unpacked at the top. Nothing outside `root` is written, whatever the archive holds."""
        blob = self._object(RUNS)
        if blob is None:
            return []
        root.mkdir(parents=True, exist_ok=True)
        top: set[str] = set()
        with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
            for m in tar.getmembers():
                parts = PurePosixPath(m.name).parts
                if len(parts) < 3 or parts[0] != "runs" or ".." in parts or not (m.isfile() or m.isdir()):
                    continue  # runs/<study>/<...> only
                rel = Path(*parts[2:])
                if len(parts) == 3 and parts[2] in LOCAL_FILES:
                    continue
                dest = root / rel
                if m.isdir():
                    dest.mkdir(parents=True, exist_ok=True)
                    continue
                dest.parent.mkdir(parents=True, exist_ok=True)
                src = tar.extractfile(m)
                if src is not None:
                    dest.write_bytes(src.read())
                    top.add(rel.parts[0])
        return sorted(top)

    def plan(self, commands: dict[str, list[str]] | None = None) -> list[str]:
        p = self.p
        lines = [line for line in super().plan(None) if "RunInstances" not in line and "tunnel" not in line]
        lines.insert(3, f"aws: s3: servelab's wheel and the params (host: local) to s3://{p.results_bucket}/servelab/"
                        "<study>/<time>/input/")
        lines.insert(4, f"aws: ec2:RunInstances {p.instance_type} once (user data: `servelab run` in {p.image} with "
                        "every GPU of the instance, its log to S3 every 30 s, its runs at the end, then shutdown)")
        lines.insert(5, "aws: here: the log followed and the runs unpacked into runs/<study>/, the page published here")
        return lines


__all__ = ["InstanceRunnerHost", "instance_params", "runner_argv", "servelab_wheel"]
