"""AWS hosts through boto3: the seeds' ECS-service stack, and a minimal single-instance path.

`EcsServiceHost` operates what seeds 000/001 built with Terraform: an ECS service on EC2 GPU
instances of an Auto Scaling group behind a capacity provider, reached through an internal
ALB. start = (register the configuration's task definition) + desired count 1, then wait for
an InService instance, a RUNNING task and a healthy ALB target; status; logs (CloudWatch);
stop = desired 0, wait for the tasks to stop, scale the group to 0 unless another service
uses the same capacity provider, wait for the instances to terminate. `SingleInstanceHost`
is for a user without that stack: one instance from the public ECS GPU AMI (SSM parameter)
whose user data runs the engine container, reached through an SSM port forward; stop =
terminate.

Guards on both: the caller's account must be the expected one (sts) before anything is
touched; GPU capacity errors move on to the next region of `regions` (seed 000 found no g7e
in Tokyo or Virginia); a host running past `max_hours` or `max_spend_usd` is stopped; every
failure path tears down what it started. Every call goes through an injectable boto3 Session
factory (moto in tests) and an injectable clock and sleep. `plan()` lists the AWS actions
without calling AWS (dry run). Not for measuring (`runner`) or prices (`prices`).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

GPU_AMI_PARAMETER = "/aws/service/ecs/optimized-ami/amazon-linux-2023/gpu/recommended/image_id"
CAPACITY_CODES = {"InsufficientInstanceCapacity", "InsufficientCapacity", "InsufficientHostCapacity",
                  "Unsupported", "InstanceLimitExceeded", "VcpuLimitExceeded", "InsufficientCapacityOnHost",
                  "MaxSpotInstanceCountExceeded", "UnfulfillableCapacity"}
CAPACITY_TEXT = re.compile(
    r"InsufficientInstanceCapacity|insufficient capacity|do not have sufficient [\w.-]+ capacity|"
    r"not supported in your requested Availability Zone|\bUnsupported\b|VcpuLimitExceeded|vCPU capacity|"
    r"InstanceLimitExceeded|UnfulfillableCapacity", re.I)
TAG_KEY = "servelab:host"
SECRET_ENV = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL)", re.I)
_TD_READONLY = ("taskDefinitionArn", "revision", "status", "requiresAttributes", "compatibilities",
                "registeredAt", "registeredBy", "deregisteredAt")


class AwsHostError(RuntimeError):
    """An AWS host could not be started, watched or stopped; the message says what and where."""


class AccountMismatch(AwsHostError):
    pass


class CapacityUnavailable(AwsHostError):
    """No region of the list had capacity; `attempts` holds (region, reason) pairs."""

    def __init__(self, attempts: list[tuple[str, str]]) -> None:
        self.attempts = attempts
        super().__init__("no GPU capacity in any region: " + "; ".join(f"{r}: {why}" for r, why in attempts))


class GuardTripped(AwsHostError):
    """The spend or time limit was reached; the host has been stopped."""


class HostTimeout(AwsHostError):
    pass


class _RegionCapacity(AwsHostError):
    pass


class _NotDeployed(AwsHostError):
    pass


class AwsParams(BaseModel):
    """`host.aws` block of a study (proposed for config.HostParams)."""

    model_config = ConfigDict(extra="forbid")
    mode: Literal["ecs-service", "single-instance"] = Field("ecs-service", description="the seeds' ECS stack, or "
                                                            "one instance from the ECS GPU AMI")
    regions: list[str] = Field(..., min_length=1, description="tried in order when GPU capacity is unavailable")
    profile: str | None = Field(None, description="AWS named profile for boto3")
    expected_account_id: str | None = Field(None, pattern=r"^\d{12}$", description="refuse any other account")
    expected_account_id_env: str | None = Field("SERVELAB_AWS_ACCOUNT_ID",
                                                description="environment variable with the expected account id")
    instance_type: str = Field(..., description="EC2 instance type (price, plan, single-instance launch)")
    # ecs-service
    cluster: str | None = Field(None, description="ECS cluster")
    service: str | None = Field(None, description="ECS service (desired 0 when idle)")
    capacity_provider: str | None = Field(None, description="default: the service's capacity provider strategy")
    asg_name: str | None = Field(None, description="default: the capacity provider's Auto Scaling group")
    target_group_arn: str | None = Field(None, description="default: the service's load balancer target group")
    container_name: str | None = Field(None, description="container that runs the engine (default: the first)")
    log_group: str | None = Field(None, description="default: the container's awslogs-group")
    shared_services: list[str] = Field(default_factory=list, description="other services on the same instances")
    update_task_definition: bool = Field(True, description="register each configuration's command as a new "
                                         "task definition revision")
    image: str | None = Field(None, description="container image (single-instance: required; ecs: override)")
    # single-instance
    subnets: dict[str, list[str]] = Field(default_factory=dict, description="region -> subnet ids (default VPC)")
    security_groups: dict[str, list[str]] = Field(default_factory=dict, description="region -> security groups")
    instance_profile: str | None = Field(None, description="IAM instance profile (SSM managed instance core)")
    ami_parameter: str = Field(GPU_AMI_PARAMETER, description="SSM parameter with the AMI id")
    root_volume_gib: int = Field(300, ge=30, description="root EBS gp3 size (model cache)")
    container_port: int = Field(8000, ge=1, le=65535, description="engine port in the container")
    local_port: int = Field(8000, ge=1, le=65535, description="local end of the SSM port forward")
    secret_parameters: dict[str, str] = Field(default_factory=dict,
                                              description="env name -> SSM SecureString read at boot (e.g. HF_TOKEN)")
    name: str = Field("servelab", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", description="tag value of the host")
    # guards and waits
    max_hours: float | None = Field(None, gt=0, description="stop the host after this long")
    max_spend_usd: float | None = Field(None, gt=0, description="stop the host when hours x price reach this")
    hourly_usd: float | None = Field(None, gt=0, description="price for the spend guard (default: Pricing API/table)")
    price_source: Literal["pricing-api", "table"] = Field("pricing-api", description="where the guard's price comes from")
    poll_s: float = Field(15.0, gt=0, description="seconds between status checks")
    start_timeout_s: float = Field(3600.0, gt=0, description="instance + task + healthy target deadline")
    stop_timeout_s: float = Field(1200.0, gt=0, description="tasks stopped + instances terminated deadline")
    max_capacity_failures: int = Field(1, ge=1, description="failed launches in a region before the next region")
    max_task_failures: int = Field(3, ge=1, description="engine tasks that may stop before the start fails")

    @model_validator(mode="after")
    def _complete(self) -> "AwsParams":
        if self.mode == "ecs-service" and not (self.cluster and self.service):
            raise ValueError("mode ecs-service needs cluster and service")
        if self.mode == "single-instance" and not self.image:
            raise ValueError("mode single-instance needs image (the engine container)")
        if self.max_hours is None and self.max_spend_usd is None:
            raise ValueError("set max_hours or max_spend_usd: a GPU host needs a limit")
        return self


@dataclass
class HostInfo:
    region: str
    mode: str
    instance_ids: list[str] = field(default_factory=list)
    task_arns: list[str] = field(default_factory=list)
    url: str | None = None
    tunnel: list[str] | None = None
    started_at: float | None = None
    hourly_usd: float | None = None
    price: str | None = None
    attempts: list[tuple[str, str]] = field(default_factory=list)

    def record(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items()}


SessionFactory = Callable[[str], Any]


def _epoch(t: Any) -> float | None:
    if t is None:
        return None
    if isinstance(t, datetime):
        return (t if t.tzinfo else t.replace(tzinfo=timezone.utc)).timestamp()
    return float(t)


def _err_code(e: BaseException) -> str:
    return str(getattr(e, "response", {}).get("Error", {}).get("Code", "")) if hasattr(e, "response") else ""


def port_forward_command(region: str, instance_id: str, remote_port: int, local_port: int,
                         host: str | None = None) -> list[str]:
    """`aws ssm start-session` port forward (needs the Session Manager plugin locally)."""
    if host:
        doc = "AWS-StartPortForwardingSessionToRemoteHost"
        params = {"host": [host], "portNumber": [str(remote_port)], "localPortNumber": [str(local_port)]}
    else:
        doc = "AWS-StartPortForwardingSession"
        params = {"portNumber": [str(remote_port)], "localPortNumber": [str(local_port)]}
    return ["aws", "ssm", "start-session", "--region", region, "--target", instance_id, "--document-name", doc,
            "--parameters", json.dumps(params, separators=(",", ":"))]


def open_tunnel(cmd: list[str], local_port: int, timeout_s: float = 30.0) -> subprocess.Popen[bytes]:
    """Start a port-forward command in its own process group; wait until the local port listens."""
    import socket

    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AwsHostError(f"port forward exited ({proc.returncode}): "
                               f"{(proc.stderr.read() if proc.stderr else b'').decode(errors='replace')[:300]}")
        with socket.socket() as s:
            s.settimeout(0.5)
            if s.connect_ex(("127.0.0.1", local_port)) == 0:
                return proc
        time.sleep(0.5)
    close_tunnel(proc)
    raise AwsHostError(f"port forward did not open 127.0.0.1:{local_port} within {timeout_s:g} s: {shlex.join(cmd)}")


def close_tunnel(proc: subprocess.Popen[bytes]) -> None:
    import signal

    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(10)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def container_argv(command: list[str]) -> tuple[list[str], list[str]]:
    """(entryPoint, command) for a container: `python -m module` is the entry point, so the
    image's own ENTRYPOINT (vllm serve, none for SGLang) does not matter.

    A secret on the command line (--api-key, --hf-token with a value) would be stored in the
    task definition or user data for anyone with describe rights to read: refused.
    """
    for flag, val in zip(command, command[1:]):
        if flag in ("--api-key", "--hf-token") and not val.startswith("$"):
            raise AwsHostError(f"{flag} with a value would be stored in the task definition / user data: "
                               "pass secrets as ECS secrets or host.aws.secret_parameters instead")
    if len(command) >= 3 and command[1] == "-m":
        return command[:3], command[3:]
    return command[:1], command[1:]


class _Base:
    mode = ""

    def __init__(self, params: AwsParams, session_factory: SessionFactory | None = None, *,
                 sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.time,
                 price_lookup: Callable[[str, str], Any] | None = None,
                 log: Callable[[str], None] | None = None) -> None:
        self.p = params
        self._factory = session_factory or self._default_factory
        self._sessions: dict[str, Any] = {}
        self._clients: dict[tuple[str, str], Any] = {}
        self._hourly: dict[str, float] = {}
        self.sleep, self.clock = sleep, clock
        self._price_lookup = price_lookup
        self.log = log or (lambda m: None)
        self.region: str | None = None
        self.started_at: float | None = None
        self.attempts: list[tuple[str, str]] = []
        self.teardown_errors: list[str] = []
        self._account_ok = False
        self._lock = threading.RLock()
        self.tripped: str | None = None

    def _default_factory(self, region: str) -> Any:
        import boto3

        return boto3.Session(profile_name=self.p.profile, region_name=region)

    def client(self, region: str, service: str) -> Any:
        with self._lock:  # boto3 sessions are not thread-safe (the watchdog shares them); clients are
            key = (region, service)
            if key not in self._clients:
                if region not in self._sessions:
                    self._sessions[region] = self._factory(region)
                self._clients[key] = self._sessions[region].client(service, region_name=region)
            return self._clients[key]

    # -- guards ----------------------------------------------------------------------------
    def expected_account(self) -> str | None:
        return self.p.expected_account_id or (os.environ.get(self.p.expected_account_id_env)
                                              if self.p.expected_account_id_env else None)

    def check_account(self) -> str:
        """Refuse to touch anything unless sts says we are in the expected account."""
        expected = self.expected_account()
        if not expected:
            raise AccountMismatch("no expected AWS account id: set host.aws.expected_account_id or "
                                  f"${self.p.expected_account_id_env}; refusing to start or stop anything")
        got = self.client(self.p.regions[0], "sts").get_caller_identity()["Account"]
        if got != expected:
            raise AccountMismatch(f"these credentials are for account {got}, expected {expected}: refusing")
        self._account_ok = True
        return got

    def hourly_usd(self, region: str) -> float:
        """The guard's price: params, else the Pricing API (cached) or the committed table; looked
        up once per region."""
        if self.p.hourly_usd:
            return self.p.hourly_usd
        if region not in self._hourly:
            if self._price_lookup:
                v = self._price_lookup(self.p.instance_type, region)
            else:
                from .prices import default_cache_dir, ec2_hourly_usd

                v = ec2_hourly_usd(self.p.instance_type, region, use_api=self.p.price_source == "pricing-api",
                                   session=self._sessions.get(region), cache_dir=default_cache_dir())
            self._hourly[region] = float(getattr(v, "usd_per_hour", v))
        return self._hourly[region]

    def spend(self, region: str | None = None) -> dict[str, Any]:
        r = region or self.region
        if self.started_at is None or r is None:
            return {"hours": 0.0, "usd": 0.0, "hourly_usd": None}
        hours = max(self.clock() - self.started_at, 0.0) / 3600.0
        hourly = self.hourly_usd(r)
        return {"hours": hours, "usd": hours * hourly, "hourly_usd": hourly}

    def guard(self) -> dict[str, Any]:
        """Stop the host (and raise GuardTripped) once max_hours or max_spend_usd is reached."""
        s = self.spend()
        why = None
        if self.p.max_hours is not None and s["hours"] >= self.p.max_hours:
            why = f"ran {s['hours']:.2f} h >= max_hours {self.p.max_hours:g}"
        elif self.p.max_spend_usd is not None and s["usd"] >= self.p.max_spend_usd:
            why = f"spent ~${s['usd']:.2f} >= max_spend_usd {self.p.max_spend_usd:g}"
        if why:
            self.tripped = why
            region = self.region
            self.log(f"guard: {why}; stopping the host in {region}")
            self._teardown(region)
            if not self.teardown_errors:
                self.region, self.started_at = None, None
            raise GuardTripped(f"{why}: host in {region} stopped" + self._teardown_note())
        return s

    def watchdog(self, interval_s: float = 60.0) -> "_Watchdog":
        """A daemon thread calling guard() every interval; stops the host when a limit trips."""
        return _Watchdog(self, interval_s)

    def _teardown(self, region: str | None) -> None:
        if region is None:
            return
        try:
            self._stop_in(region)
        except Exception as e:  # noqa: BLE001 - record, the caller raises the original error
            msg = f"teardown in {region} failed: {type(e).__name__}: {e}"
            self.teardown_errors.append(msg)
            self.log(msg)

    def _teardown_note(self) -> str:
        if not self.teardown_errors:
            return ""
        return ("; TEARDOWN FAILED, resources may still cost money: " + " | ".join(self.teardown_errors))

    def _wait(self, what: str, deadline: float, check: Callable[[], Any], guard: bool = True) -> Any:
        while True:
            if guard:
                self.guard()
            got = check()
            if got:
                return got
            if self.clock() > deadline:
                raise HostTimeout(f"{what}: not done before the deadline")
            self.sleep(self.p.poll_s)

    # -- region loop -----------------------------------------------------------------------
    def start(self, command: list[str] | None = None, env: dict[str, str] | None = None) -> HostInfo:
        """Start in the first region with capacity; tear down on every failure."""
        self.check_account()
        self.attempts, self.teardown_errors, self.tripped = [], [], None
        for region in self.p.regions:
            try:
                info = self._start_in(region, command, env or {})
                info.attempts = list(self.attempts)
                return info
            except _NotDeployed as e:
                self.attempts.append((region, str(e)))
                self.log(f"{region}: {e}")
                continue
            except _RegionCapacity as e:
                self.attempts.append((region, str(e)))
                self.log(f"{region}: no capacity ({e}); tearing down and trying the next region")
                self._teardown(region)
                if self.teardown_errors:
                    raise AwsHostError(f"{region}: {e}" + self._teardown_note()) from None
                self.region, self.started_at = None, None
                continue
            except GuardTripped:
                raise
            except BaseException as e:
                self.log(f"{region}: start failed ({type(e).__name__}: {e}); tearing down")
                self._teardown(region)
                if isinstance(e, Exception) and self.teardown_errors:
                    raise AwsHostError(f"{region}: start failed: {e}" + self._teardown_note()) from e
                self.region, self.started_at = None, None
                raise
        raise CapacityUnavailable(self.attempts)

    def stop(self, region: str | None = None) -> dict[str, list[str]]:
        """Stop in `region`, the active region, or (nothing known) every listed region. Idempotent."""
        if not self._account_ok:
            self.check_account()
        regions = [region] if region else ([self.region] if self.region else list(self.p.regions))
        out = {r: self._stop_in(r) for r in regions}
        if self.region in regions:
            self.region, self.started_at = None, None
        return out

    def _start_in(self, region: str, command: list[str] | None, env: dict[str, str]) -> HostInfo:
        raise NotImplementedError

    def _stop_in(self, region: str) -> list[str]:
        raise NotImplementedError


class _Watchdog:
    def __init__(self, host: _Base, interval_s: float) -> None:
        self.host, self.interval_s = host, interval_s
        self._stop = threading.Event()
        self.error: BaseException | None = None
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.host.guard()
            except GuardTripped as e:
                self.error = e
                return
            except Exception as e:  # noqa: BLE001 - keep watching through transient API errors
                self.host.log(f"watchdog: {type(e).__name__}: {e}")

    def __enter__(self) -> "_Watchdog":
        self._t.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._t.join(5)


# ==========================================================================================
class EcsServiceHost(_Base):
    """The seeds' stack: ECS service on EC2 (ASG behind a capacity provider) and an internal ALB."""

    mode = "ecs-service"

    # -- discovery ---------------------------------------------------------------------------
    def _service(self, region: str) -> dict[str, Any]:
        ecs = self.client(region, "ecs")
        try:
            r = ecs.describe_services(cluster=self.p.cluster, services=[self.p.service])
        except Exception as e:  # noqa: BLE001 - ClusterNotFound and friends: not deployed here
            if _err_code(e) in ("ClusterNotFoundException", "ServiceNotFoundException", "InvalidParameterException"):
                raise _NotDeployed(f"ECS service {self.p.cluster}/{self.p.service} not found ({_err_code(e)})") from None
            raise
        svcs = [s for s in r.get("services", []) if s.get("status") != "INACTIVE"]
        if not svcs:
            raise _NotDeployed(f"ECS service {self.p.cluster}/{self.p.service} not found in {region}")
        return svcs[0]

    def _capacity_provider(self, region: str, svc: dict[str, Any]) -> str | None:
        if self.p.capacity_provider:
            return self.p.capacity_provider
        strat = svc.get("capacityProviderStrategy") or []
        if strat:
            return strat[0]["capacityProvider"]
        cl = self.client(region, "ecs").describe_clusters(clusters=[self.p.cluster])["clusters"]
        default = (cl[0].get("defaultCapacityProviderStrategy") or []) if cl else []
        return default[0]["capacityProvider"] if default else None

    def _asg(self, region: str, svc: dict[str, Any]) -> str | None:
        if self.p.asg_name:
            return self.p.asg_name
        cp = self._capacity_provider(region, svc)
        if not cp:
            return None
        cps = self.client(region, "ecs").describe_capacity_providers(capacityProviders=[cp]).get("capacityProviders", [])
        arn = (cps[0].get("autoScalingGroupProvider") or {}).get("autoScalingGroupArn", "") if cps else ""
        return arn.split("autoScalingGroupName/")[-1] if arn else None

    def _target_group(self, svc: dict[str, Any]) -> str | None:
        if self.p.target_group_arn:
            return self.p.target_group_arn
        lbs = svc.get("loadBalancers") or []
        return lbs[0].get("targetGroupArn") if lbs else None

    def _task_definition(self, region: str, arn: str) -> dict[str, Any]:
        return self.client(region, "ecs").describe_task_definition(taskDefinition=arn)["taskDefinition"]

    def _container(self, td: dict[str, Any]) -> dict[str, Any]:
        cds = td.get("containerDefinitions") or []
        if self.p.container_name:
            for c in cds:
                if c.get("name") == self.p.container_name:
                    return c
            raise AwsHostError(f"task definition {td.get('family')} has no container {self.p.container_name!r}")
        if not cds:
            raise AwsHostError(f"task definition {td.get('family')} has no containers")
        return cds[0]

    # -- task definition ---------------------------------------------------------------------
    @staticmethod
    def _td_matches(c: dict[str, Any], entry: list[str], cmd: list[str], env: dict[str, str], image: str | None) -> bool:
        have_env = {e["name"]: e["value"] for e in c.get("environment", [])}
        return (c.get("entryPoint") == entry and c.get("command") == cmd
                and all(have_env.get(k) == v for k, v in env.items()) and (image is None or c.get("image") == image))

    def register_task_definition(self, region: str, base_arn: str, command: list[str], env: dict[str, str]) -> str:
        """A new revision of the service's task definition with this engine command and env.

        Returns the base ARN unchanged when it already runs exactly this command (idempotent).
        """
        td = self._task_definition(region, base_arn)
        entry, cmd = container_argv(command)
        c = self._container(td)
        if self._td_matches(c, entry, cmd, env, self.p.image):
            return td["taskDefinitionArn"]
        new = {k: v for k, v in td.items() if k not in _TD_READONLY}
        cds = []
        for cd in td["containerDefinitions"]:
            cd = dict(cd)
            if cd.get("name") == c.get("name"):
                cd["entryPoint"], cd["command"] = entry, cmd
                merged = {e["name"]: e["value"] for e in cd.get("environment", [])}
                merged.update(env)
                cd["environment"] = [{"name": k, "value": v} for k, v in sorted(merged.items())]
                if self.p.image:
                    cd["image"] = self.p.image
                if str(env.get("SGLANG_DSV41_ENGRAM_HOST_TABLE_PIN", "")).lower() in ("true", "1"):
                    lims = [u for u in cd.get("ulimits", []) if u.get("name") != "memlock"]
                    cd["ulimits"] = lims + [{"name": "memlock", "softLimit": -1, "hardLimit": -1}]
            cds.append(cd)
        new["containerDefinitions"] = cds
        arn = self.client(region, "ecs").register_task_definition(**new)["taskDefinition"]["taskDefinitionArn"]
        self.log(f"{region}: registered {arn}")
        return arn

    # -- probes ------------------------------------------------------------------------------
    def _tasks(self, region: str, desired: str = "RUNNING") -> list[dict[str, Any]]:
        ecs = self.client(region, "ecs")
        arns = [a for page in ecs.get_paginator("list_tasks").paginate(
            cluster=self.p.cluster, serviceName=self.p.service, desiredStatus=desired) for a in page.get("taskArns", [])]
        tasks: list[dict[str, Any]] = []
        for i in range(0, len(arns), 100):
            tasks += ecs.describe_tasks(cluster=self.p.cluster, tasks=arns[i:i + 100]).get("tasks", [])
        group = f"service:{self.p.service}"
        # list_tasks(serviceName=...) already filters on AWS; the group check keeps other tasks out
        # where a backend (moto) does not filter
        return [t for t in tasks if t.get("group") in (None, group)]

    def _instances(self, region: str, asg: str | None) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
        if not asg:
            return None, []
        groups = self.client(region, "autoscaling").describe_auto_scaling_groups(
            AutoScalingGroupNames=[asg]).get("AutoScalingGroups", [])
        if not groups:
            raise _NotDeployed(f"Auto Scaling group {asg} not found")
        return groups[0], groups[0].get("Instances", [])

    def _capacity_failures(self, region: str, asg: str | None, since: float) -> list[str]:
        if not asg:
            return []
        acts = self.client(region, "autoscaling").describe_scaling_activities(
            AutoScalingGroupName=asg, MaxRecords=50).get("Activities", [])
        out = []
        for a in acts:
            t = _epoch(a.get("StartTime"))
            if t is not None and t < since - 60:
                continue
            text = " ".join(str(a.get(k, "")) for k in ("StatusMessage", "Description", "Cause"))
            if a.get("StatusCode") in ("Failed", "Cancelled") and CAPACITY_TEXT.search(text):
                out.append(str(a.get("StatusMessage") or a.get("Description")))
        return out

    def _target_health(self, region: str, tg: str | None) -> list[dict[str, Any]]:
        if not tg:
            return []
        return self.client(region, "elbv2").describe_target_health(TargetGroupArn=tg).get(
            "TargetHealthDescriptions", [])

    def _task_failures(self, region: str, since: float, td_arn: str | None) -> list[str]:
        out = []
        for t in self._tasks(region, "STOPPED"):
            stopped = _epoch(t.get("stoppedAt"))
            if stopped is None or stopped < since or (td_arn and t.get("taskDefinitionArn") != td_arn):
                continue
            codes = [c.get("exitCode") for c in t.get("containers", []) if c.get("exitCode") not in (None, 0)]
            if codes or t.get("stopCode") in ("TaskFailedToStart", "EssentialContainerExited"):
                out.append(f"{t.get('taskArn', '').split('/')[-1]}: {t.get('stoppedReason', t.get('stopCode'))}")
        return out

    def probe(self, region: str, since: float | None = None, td_arn: str | None = None) -> dict[str, Any]:
        """One look at the stack: service, instances, tasks, targets, capacity failures."""
        svc = self._service(region)
        asg = self._asg(region, svc)
        group, insts = self._instances(region, asg)
        tasks = self._tasks(region)
        tg = self._target_group(svc)
        health = self._target_health(region, tg)
        in_service = [i for i in insts if i.get("LifecycleState") == "InService"]
        running = [t for t in tasks if t.get("lastStatus") == "RUNNING"
                   and (td_arn is None or t.get("taskDefinitionArn") == td_arn)]
        healthy = [h for h in health if h.get("TargetHealth", {}).get("State") == "healthy"]
        ips = {d.get("value") for t in running for a in t.get("attachments", []) for d in a.get("details", [])
               if d.get("name") == "privateIPv4Address"}
        if ips:
            healthy = [h for h in healthy if h.get("Target", {}).get("Id") in ips] or []
        return {
            "region": region, "service": svc, "asg": asg, "asg_group": group, "instances": insts,
            "in_service": in_service, "tasks": tasks, "running": running, "target_group": tg, "targets": health,
            "healthy": healthy,
            "capacity_failures": self._capacity_failures(region, asg, since) if since is not None else [],
            "ready": bool(in_service or not asg) and bool(running) and (bool(healthy) or not tg),
        }

    def _launch_times(self, region: str, instance_ids: list[str]) -> list[float]:
        if not instance_ids:
            return []
        res = self.client(region, "ec2").describe_instances(InstanceIds=instance_ids).get("Reservations", [])
        return [t for r in res for i in r.get("Instances", []) if (t := _epoch(i.get("LaunchTime"))) is not None]

    def _wait_ready(self, region: str, since: float, td_arn: str | None) -> dict[str, Any]:
        deadline = self.clock() + self.p.start_timeout_s
        while True:
            self.guard()
            st = self.probe(region, since, td_arn)
            launched = self._launch_times(region, [i["InstanceId"] for i in st["instances"]])
            if launched and self.started_at is not None:
                self.started_at = min(self.started_at, min(launched))
            if len(st["capacity_failures"]) >= self.p.max_capacity_failures:
                raise _RegionCapacity(st["capacity_failures"][-1])
            fails = self._task_failures(region, since, td_arn)
            if len(fails) >= self.p.max_task_failures:
                raise AwsHostError(f"{region}: the engine task stopped {len(fails)} times: {fails[-1]}"
                                   + self._log_hint(region))
            if st["ready"]:
                return st
            if self.clock() > deadline:
                raise HostTimeout(f"{region}: not ready after {self.p.start_timeout_s:g} s (instances "
                                  f"{[i.get('LifecycleState') for i in st['instances']]}, tasks "
                                  f"{[t.get('lastStatus') for t in st['tasks']]}, targets "
                                  f"{[h.get('TargetHealth', {}).get('State') for h in st['targets']]})"
                                  + self._log_hint(region))
            self.sleep(self.p.poll_s)

    def _log_hint(self, region: str) -> str:
        try:
            tail = self.logs(region=region, limit=20)
        except Exception:  # noqa: BLE001 - logs are a courtesy in an error message
            return ""
        return ("\nlast engine log lines:\n" + "\n".join(tail[-20:])) if tail else ""

    def _info(self, region: str, st: dict[str, Any]) -> HostInfo:
        url, tunnel = self._endpoint(region, st)
        hourly = None
        try:
            hourly = self.hourly_usd(region)
        except Exception:  # noqa: BLE001 - the guard re-raises when it needs the price
            pass
        return HostInfo(region=region, mode=self.mode, instance_ids=[i["InstanceId"] for i in st["in_service"]],
                        task_arns=[t["taskArn"] for t in st["running"]], url=url, tunnel=tunnel,
                        started_at=self.started_at, hourly_usd=hourly)

    def _endpoint(self, region: str, st: dict[str, Any]) -> tuple[str | None, list[str] | None]:
        tg = st.get("target_group")
        if not tg:
            return None, None
        elb = self.client(region, "elbv2")
        tgs = elb.describe_target_groups(TargetGroupArns=[tg]).get("TargetGroups", [])
        lb_arns = tgs[0].get("LoadBalancerArns", []) if tgs else []
        if not lb_arns:
            return None, None
        lb = elb.describe_load_balancers(LoadBalancerArns=lb_arns[:1])["LoadBalancers"][0]
        listeners = elb.describe_listeners(LoadBalancerArn=lb["LoadBalancerArn"]).get("Listeners", [])
        port = listeners[0]["Port"] if listeners else 80
        dns = lb["DNSName"]
        url = f"http://{dns}:{port}" if port != 80 else f"http://{dns}"
        tunnel = None
        if st.get("in_service"):
            tunnel = port_forward_command(region, st["in_service"][0]["InstanceId"], port, self.p.local_port, host=dns)
        return url, tunnel

    # -- lifecycle ---------------------------------------------------------------------------
    def _start_in(self, region: str, command: list[str] | None, env: dict[str, str]) -> HostInfo:
        svc = self._service(region)
        ecs = self.client(region, "ecs")
        self.region = region
        td_arn = None
        update: dict[str, Any] = {"cluster": self.p.cluster, "service": self.p.service, "desiredCount": 1}
        if command and self.p.update_task_definition:
            td_arn = self.register_task_definition(region, svc["taskDefinition"], command, env)
            if td_arn != svc["taskDefinition"]:
                update.update(taskDefinition=td_arn,
                              deploymentConfiguration={"minimumHealthyPercent": 0, "maximumPercent": 100})
        now = self.clock()
        self.started_at = now if self.started_at is None else self.started_at
        self.log(f"{region}: ecs:UpdateService {self.p.service} desiredCount=1")
        ecs.update_service(**update)
        st = self._wait_ready(region, now, td_arn)
        return self._info(region, st)

    def deploy(self, command: list[str], env: dict[str, str] | None = None) -> HostInfo:
        """Switch the running service to another configuration (same instance; old task first).

        Any failure tears the host down, like a failed start.
        """
        if self.region is None:
            return self.start(command, env)
        region = self.region
        try:
            svc = self._service(region)
            td_arn = self.register_task_definition(region, svc["taskDefinition"], command, env or {})
            now = self.clock()
            if td_arn != svc["taskDefinition"] or svc.get("desiredCount") != 1:
                self.client(region, "ecs").update_service(
                    cluster=self.p.cluster, service=self.p.service, desiredCount=1, taskDefinition=td_arn,
                    deploymentConfiguration={"minimumHealthyPercent": 0, "maximumPercent": 100})
            st = self._wait_ready(region, now, td_arn)
            return self._info(region, st)
        except GuardTripped:
            raise
        except BaseException as e:
            self._teardown(region)
            self.region, self.started_at = None, None
            if isinstance(e, Exception) and self.teardown_errors:
                raise AwsHostError(f"{region}: deploy failed: {e}" + self._teardown_note()) from e
            raise

    def _sharing(self, region: str, cp: str | None) -> list[str]:
        """Other services that run on the same capacity provider and are not idle."""
        ecs = self.client(region, "ecs")
        arns = [a for page in ecs.get_paginator("list_services").paginate(cluster=self.p.cluster)
                for a in page.get("serviceArns", [])]
        others = [a for a in arns if a.split("/")[-1] != self.p.service]
        cl = ecs.describe_clusters(clusters=[self.p.cluster]).get("clusters", [])
        default = {s["capacityProvider"] for s in (cl[0].get("defaultCapacityProviderStrategy") or [])} if cl else set()
        busy = []
        for i in range(0, len(others), 10):
            for s in ecs.describe_services(cluster=self.p.cluster, services=others[i:i + 10]).get("services", []):
                if s.get("status") == "INACTIVE":
                    continue
                strat = {x["capacityProvider"] for x in s.get("capacityProviderStrategy") or []}
                # a service without a strategy (launch type EC2, or the cluster default) can be
                # placed on the capacity provider's instances too: count it as sharing
                uses = (cp in strat) or (not strat and s.get("launchType") != "FARGATE"
                                         and (cp in default or s.get("launchType") == "EC2")) \
                    or s["serviceName"] in self.p.shared_services
                if uses and (s.get("desiredCount", 0) > 0 or s.get("runningCount", 0) > 0):
                    busy.append(s["serviceName"])
        return busy

    def _stop_in(self, region: str) -> list[str]:
        done: list[str] = []
        try:
            svc = self._service(region)
        except _NotDeployed as e:
            return [f"{region}: nothing to stop ({e})"]
        ecs = self.client(region, "ecs")
        if svc.get("desiredCount", 0) != 0:
            ecs.update_service(cluster=self.p.cluster, service=self.p.service, desiredCount=0)
            done.append(f"ecs:UpdateService {self.p.service} desiredCount=0")
        deadline = self.clock() + self.p.stop_timeout_s

        def tasks_gone() -> bool:
            live = [t for t in self._tasks(region) if t.get("lastStatus") != "STOPPED"]
            live += [t for t in self._tasks(region, "STOPPED") if t.get("lastStatus") not in ("STOPPED", None)]
            return not live

        self._wait(f"{region}: service tasks to stop", deadline, tasks_gone, guard=False)
        done.append("tasks stopped")
        cp = self._capacity_provider(region, svc)
        busy = self._sharing(region, cp)
        if busy:
            done.append(f"Auto Scaling group kept: {busy} also use capacity provider {cp}")
            return done
        asg = self._asg(region, svc)
        group, insts = self._instances(region, asg)
        if group is None:
            return done
        auto = self.client(region, "autoscaling")
        protected = [i["InstanceId"] for i in insts if i.get("ProtectedFromScaleIn")]
        if protected:
            auto.set_instance_protection(InstanceIds=protected, AutoScalingGroupName=asg, ProtectedFromScaleIn=False)
            done.append(f"scale-in protection removed from {protected}")
        if group.get("DesiredCapacity", 0) != 0 or group.get("MinSize", 0) != 0:
            kw: dict[str, Any] = {"AutoScalingGroupName": asg, "DesiredCapacity": 0}
            if group.get("MinSize", 0) != 0:
                kw["MinSize"] = 0
                done.append(f"MinSize {group['MinSize']} -> 0 (the group cannot reach 0 otherwise)")
            auto.update_auto_scaling_group(**kw)
            done.append(f"autoscaling:UpdateAutoScalingGroup {asg} DesiredCapacity=0")
        ids = [i["InstanceId"] for i in insts]

        def terminated() -> bool:
            _, left = self._instances(region, asg)
            if left:
                return False
            if not ids:
                return True
            res = self.client(region, "ec2").describe_instances(InstanceIds=ids).get("Reservations", [])
            states = [i["State"]["Name"] for r in res for i in r.get("Instances", [])]
            return all(s == "terminated" for s in states)

        self._wait(f"{region}: instances of {asg} to terminate", deadline, terminated, guard=False)
        if ids:
            done.append(f"instances terminated: {ids}")
        return done

    # -- watching ----------------------------------------------------------------------------
    def status(self, region: str | None = None) -> dict[str, Any]:
        """Service, tasks, instances, targets, time and money so far, per region."""
        regions = [region] if region else ([self.region] if self.region else list(self.p.regions))
        out: dict[str, Any] = {}
        for r in regions:
            try:
                st = self.probe(r)
            except _NotDeployed as e:
                out[r] = {"deployed": False, "reason": str(e)}
                continue
            svc = st["service"]
            launched = self._launch_times(r, [i["InstanceId"] for i in st["instances"]])
            hours = (self.clock() - min(launched)) / 3600 if launched else 0.0
            try:
                hourly = self.hourly_usd(r)
            except Exception:  # noqa: BLE001
                hourly = None
            url, tunnel = self._endpoint(r, st)
            out[r] = {
                "deployed": True,
                "service": {k: svc.get(k) for k in ("desiredCount", "runningCount", "pendingCount", "taskDefinition")},
                "deployments": [{k: d.get(k) for k in ("status", "rolloutState", "desiredCount", "runningCount")}
                                for d in svc.get("deployments", [])],
                "asg": st["asg"], "asg_desired": (st["asg_group"] or {}).get("DesiredCapacity"),
                "instances": [{"id": i["InstanceId"], "state": i.get("LifecycleState"),
                               "type": i.get("InstanceType")} for i in st["instances"]],
                "tasks": [{"id": t["taskArn"].split("/")[-1], "last": t.get("lastStatus"),
                           "task_definition": t.get("taskDefinitionArn", "").split("/")[-1]} for t in st["tasks"]],
                "targets": [{"id": h.get("Target", {}).get("Id"), "state": h.get("TargetHealth", {}).get("State")}
                            for h in st["targets"]],
                "ready": st["ready"], "url": url, "tunnel": shlex.join(tunnel) if tunnel else None,
                "hours_running": hours, "hourly_usd": hourly,
                "spend_usd": hours * hourly if hourly is not None else None,
                "limits": {"max_hours": self.p.max_hours, "max_spend_usd": self.p.max_spend_usd},
            }
        return out

    def logs(self, region: str | None = None, since_s: float = 3600, limit: int = 200) -> list[str]:
        """Engine log lines from CloudWatch (the task definition's awslogs group/stream prefix)."""
        r = region or self.region or self.p.regions[0]
        svc = self._service(r)
        td = self._task_definition(r, svc["taskDefinition"])
        c = self._container(td)
        opts = (c.get("logConfiguration") or {}).get("options", {})
        group = self.p.log_group or opts.get("awslogs-group")
        if not group:
            raise AwsHostError(f"no log group: the container has no awslogs configuration; set host.aws.log_group")
        prefix = opts.get("awslogs-stream-prefix")
        tasks = self._tasks(r) or self._tasks(r, "STOPPED")
        kw: dict[str, Any] = {"logGroupName": group, "startTime": int((self.clock() - since_s) * 1000),
                              "limit": limit}
        if prefix and tasks:
            kw["logStreamNames"] = [f"{prefix}/{c['name']}/{t['taskArn'].split('/')[-1]}" for t in tasks][:100]
        elif prefix:
            kw["logStreamNamePrefix"] = prefix
        logs = self.client(r, "logs")
        try:
            events = logs.filter_log_events(**kw).get("events", [])
        except Exception as e:  # noqa: BLE001
            if _err_code(e) == "ResourceNotFoundException" and "logStreamNames" in kw:
                kw.pop("logStreamNames")
                events = logs.filter_log_events(**kw).get("events", [])
            else:
                raise
        return [f"{datetime.fromtimestamp(e['timestamp'] / 1000, timezone.utc).isoformat(timespec='seconds')} "
                f"{e['message'].rstrip()}" for e in sorted(events, key=lambda e: e["timestamp"])][-limit:]

    def tunnel_command(self, region: str | None = None) -> list[str] | None:
        r = region or self.region or self.p.regions[0]
        return self._endpoint(r, self.probe(r))[1]

    # -- dry run -----------------------------------------------------------------------------
    def plan(self, commands: dict[str, list[str]] | None = None) -> list[str]:
        p = self.p
        lines = [
            f"aws: ecs-service {p.cluster}/{p.service}, {p.instance_type}; regions in order {', '.join(p.regions)} "
            "(next region on InsufficientInstanceCapacity / unsupported / vCPU limit)",
            "aws: guard: sts:GetCallerIdentity must be "
            + (p.expected_account_id or f"${p.expected_account_id_env}") + " before any call that changes anything",
        ]
        cp = p.capacity_provider or "the service's capacity provider"
        asg = p.asg_name or "its Auto Scaling group"
        for i, (cid, cmd) in enumerate((commands or {"<configuration>": []}).items()):
            if p.update_task_definition and cmd:
                entry, args = container_argv(cmd)
                lines.append(f"aws: [{cid}] ecs:RegisterTaskDefinition (service's family; container "
                             f"{p.container_name or '<first>'}: entryPoint {' '.join(entry)}, {len(args)} args"
                             + (f", image {p.image}" if p.image else "") + ")")
            if i == 0:
                lines.append(f"aws: [{cid}] ecs:UpdateService {p.service} desiredCount=1 -> {cp} scales {asg} 0->1 "
                             f"({p.instance_type})")
                lines.append(f"aws: [{cid}] wait (poll {p.poll_s:g} s, {p.start_timeout_s:g} s): instance InService, "
                             "task RUNNING, ALB target healthy; a failed launch for capacity -> stop here, next region")
            else:
                lines.append(f"aws: [{cid}] ecs:UpdateService taskDefinition=<new> (minimumHealthyPercent 0: old task "
                             "stops first on the same instance); wait task RUNNING + target healthy")
        lines.append(f"aws: tunnel: aws ssm start-session --target <instance> --document-name "
                     f"AWS-StartPortForwardingSessionToRemoteHost --parameters host=<internal ALB DNS>,portNumber=80,"
                     f"localPortNumber={p.local_port}")
        lines.append(f"aws: stop: ecs:UpdateService desiredCount=0; wait tasks STOPPED; unless another service uses "
                     f"{cp}: remove scale-in protection, autoscaling:UpdateAutoScalingGroup {asg} DesiredCapacity=0; "
                     f"wait instances terminated ({p.stop_timeout_s:g} s)")
        lines.append("aws: " + _guard_line(p) + "; every failure path runs the stop above")
        return lines


def _guard_line(p: AwsParams) -> str:
    parts = []
    if p.max_hours:
        parts.append(f"{p.max_hours:g} h")
    if p.max_spend_usd:
        parts.append(f"${p.max_spend_usd:g}")
    return "limit: stop after " + " or ".join(parts) + " (elapsed hours x hourly price)"


# ==========================================================================================
class SingleInstanceHost(_Base):
    """One GPU instance from the public ECS GPU AMI running the engine container (no ECS)."""

    mode = "single-instance"

    def ami(self, region: str) -> str:
        return self.client(region, "ssm").get_parameter(Name=self.p.ami_parameter)["Parameter"]["Value"]

    def _network(self, region: str) -> tuple[list[str], list[str]]:
        ec2 = self.client(region, "ec2")
        subnets = self.p.subnets.get(region)
        sgs = self.p.security_groups.get(region)
        if not subnets or not sgs:
            vpcs = ec2.describe_vpcs(Filters=[{"Name": "isDefault", "Values": ["true"]}]).get("Vpcs", [])
            if not vpcs:
                raise _NotDeployed(f"no subnets given for {region} and no default VPC there")
            vpc = vpcs[0]["VpcId"]
            if not subnets:
                subnets = [s["SubnetId"] for s in ec2.describe_subnets(
                    Filters=[{"Name": "vpc-id", "Values": [vpc]}]).get("Subnets", [])]
            if not sgs:
                sgs = [g["GroupId"] for g in ec2.describe_security_groups(
                    Filters=[{"Name": "vpc-id", "Values": [vpc]}, {"Name": "group-name", "Values": ["default"]}]
                ).get("SecurityGroups", [])]
        return list(subnets), list(sgs)

    def user_data(self, command: list[str], env: dict[str, str], region: str) -> str:
        """Boot script: a dead-man shutdown at max_hours, then `docker run` of the engine."""
        for k in env:
            if SECRET_ENV.search(k):
                raise AwsHostError(f"env {k} looks secret; user data is readable by anyone with "
                                   "ec2:DescribeInstanceAttribute: put it in SSM and use host.aws.secret_parameters")
        q = shlex.quote
        lines = ["#!/bin/bash", "# servelab single-instance host: the engine container, no ECS cluster",
                 "set -euo pipefail"]
        if self.p.max_hours:
            minutes = max(int(self.p.max_hours * 60), 1)
            lines.append(f"shutdown -h +{minutes}  # dead-man switch: shutdown behaviour is terminate")
        lines += ["systemctl disable --now ecs || true", "mkdir -p /var/lib/llm-model-cache",
                  'TOKEN=$(curl -sX PUT http://169.254.169.254/latest/api/token '
                  '-H "X-aws-ec2-metadata-token-ttl-seconds: 300")',
                  'IID=$(curl -s -H "X-aws-ec2-metadata-token: $TOKEN" '
                  'http://169.254.169.254/latest/meta-data/instance-id)']
        for name, param in self.p.secret_parameters.items():
            lines.append(f"export {name}=$(aws ssm get-parameter --region {q(region)} --with-decryption --name "
                         f"{q(param)} --query Parameter.Value --output text)")
        entry, args = container_argv(command)
        words = ["docker", "run", "-d", "--name", "servelab-engine", "--restart", "no", "--gpus", "all",
                 "--ipc=host", "--ulimit", "memlock=-1:-1", "-p", f"{self.p.container_port}:{self.p.container_port}",
                 "-v", "/var/lib/llm-model-cache:/root/.cache/huggingface"]
        run = [q(w) for w in words]
        if self.p.log_group:
            run += [q(w) for w in ["--log-driver", "awslogs", "--log-opt", f"awslogs-region={region}", "--log-opt",
                                   f"awslogs-group={self.p.log_group}", "--log-opt", "awslogs-create-group=true",
                                   "--log-opt"]]
            run.append('"awslogs-stream=$IID"')  # expanded by the shell: one stream per instance
        for k, v in sorted(env.items()):
            run += ["-e", q(f"{k}={v}")]
        for name in self.p.secret_parameters:
            run += ["-e", q(name)]
        run += [q(w) for w in ["--entrypoint", entry[0], str(self.p.image), *entry[1:], *args]]
        lines.append(" ".join(run))
        return "\n".join(lines) + "\n"

    def _find(self, region: str, states: tuple[str, ...] = ("pending", "running")) -> list[dict[str, Any]]:
        res = self.client(region, "ec2").describe_instances(Filters=[
            {"Name": f"tag:{TAG_KEY}", "Values": [self.p.name]},
            {"Name": "instance-state-name", "Values": list(states)}]).get("Reservations", [])
        return [i for r in res for i in r.get("Instances", [])]

    def _start_in(self, region: str, command: list[str] | None, env: dict[str, str]) -> HostInfo:
        if not command:
            raise AwsHostError("single-instance needs the engine command")
        ec2 = self.client(region, "ec2")
        existing = self._find(region)
        self.region = region
        if existing:
            inst = existing[0]
            self.log(f"{region}: reusing {inst['InstanceId']}")
        else:
            ami = self.ami(region)
            subnets, sgs = self._network(region)
            ud = self.user_data(command, env, region)
            last = None
            inst = None
            for subnet in subnets or [None]:
                kw: dict[str, Any] = dict(
                    ImageId=ami, InstanceType=self.p.instance_type, MinCount=1, MaxCount=1, UserData=ud,
                    InstanceInitiatedShutdownBehavior="terminate",
                    BlockDeviceMappings=[{"DeviceName": "/dev/xvda", "Ebs": {
                        "VolumeSize": self.p.root_volume_gib, "VolumeType": "gp3", "Encrypted": True,
                        "DeleteOnTermination": True}}],
                    MetadataOptions={"HttpTokens": "required", "HttpEndpoint": "enabled",
                                     "HttpPutResponseHopLimit": 2},
                    TagSpecifications=[{"ResourceType": "instance", "Tags": [
                        {"Key": TAG_KEY, "Value": self.p.name}, {"Key": "Name", "Value": f"servelab-{self.p.name}"}]}])
                if subnet:
                    kw["SubnetId"] = subnet
                if sgs:
                    kw["SecurityGroupIds"] = sgs
                if self.p.instance_profile:
                    kw["IamInstanceProfile"] = {"Name": self.p.instance_profile}
                try:
                    inst = ec2.run_instances(**kw)["Instances"][0]
                    break
                except Exception as e:  # noqa: BLE001
                    if _err_code(e) in CAPACITY_CODES or CAPACITY_TEXT.search(str(e)):
                        last = f"{_err_code(e) or 'capacity'} in {subnet}: {str(e)[:200]}"
                        continue
                    raise
            if inst is None:
                raise _RegionCapacity(last or "run_instances found no capacity")
            self.log(f"{region}: ec2:RunInstances -> {inst['InstanceId']}")
        iid = inst["InstanceId"]
        launched = _epoch(inst.get("LaunchTime")) or self.clock()
        self.started_at = min(launched, self.clock()) if self.started_at is None else self.started_at
        deadline = self.clock() + self.p.start_timeout_s

        def running() -> bool:
            res = ec2.describe_instances(InstanceIds=[iid])["Reservations"]
            state = res[0]["Instances"][0]["State"]["Name"]
            if state in ("terminated", "shutting-down", "stopped", "stopping"):
                raise AwsHostError(f"{iid} is {state}: " + str(res[0]["Instances"][0].get("StateReason", {})))
            return state == "running"

        self._wait(f"{region}: {iid} running", deadline, running)
        hourly = None
        try:
            hourly = self.hourly_usd(region)
        except Exception:  # noqa: BLE001
            pass
        return HostInfo(region=region, mode=self.mode, instance_ids=[iid],
                        url=f"http://127.0.0.1:{self.p.local_port}",
                        tunnel=port_forward_command(region, iid, self.p.container_port, self.p.local_port),
                        started_at=self.started_at, hourly_usd=hourly)

    def wait_healthy(self, url: str, timeout_s: float | None = None) -> None:
        """Poll <url>/health (through the tunnel) until 200; the guard runs meanwhile."""
        import httpx

        deadline = self.clock() + (timeout_s or self.p.start_timeout_s)

        def ok() -> bool:
            try:
                return httpx.get(url.rstrip("/") + "/health", timeout=5).status_code == 200
            except httpx.HTTPError:
                return False

        self._wait("engine /health", deadline, ok)

    def _stop_in(self, region: str) -> list[str]:
        ids = [i["InstanceId"] for i in self._find(region, ("pending", "running", "stopping", "stopped"))]
        if not ids:
            return [f"{region}: no servelab instance {self.p.name!r}"]
        ec2 = self.client(region, "ec2")
        ec2.terminate_instances(InstanceIds=ids)
        deadline = self.clock() + self.p.stop_timeout_s

        def gone() -> bool:
            res = ec2.describe_instances(InstanceIds=ids)["Reservations"]
            return all(i["State"]["Name"] == "terminated" for r in res for i in r["Instances"])

        self._wait(f"{region}: {ids} terminated", deadline, gone, guard=False)
        return [f"ec2:TerminateInstances {ids}", "terminated"]

    def status(self, region: str | None = None) -> dict[str, Any]:
        regions = [region] if region else ([self.region] if self.region else list(self.p.regions))
        out: dict[str, Any] = {}
        for r in regions:
            insts = self._find(r, ("pending", "running", "stopping", "stopped", "shutting-down"))
            rows = []
            for i in insts:
                t = _epoch(i.get("LaunchTime"))
                hours = (self.clock() - t) / 3600 if t else 0.0
                rows.append({"id": i["InstanceId"], "state": i["State"]["Name"], "type": i.get("InstanceType"),
                             "hours_running": hours,
                             "tunnel": shlex.join(port_forward_command(r, i["InstanceId"], self.p.container_port,
                                                                       self.p.local_port))})
            out[r] = {"instances": rows, "limits": {"max_hours": self.p.max_hours, "max_spend_usd": self.p.max_spend_usd}}
        return out

    def logs(self, region: str | None = None, since_s: float = 3600, limit: int = 200) -> list[str]:
        r = region or self.region or self.p.regions[0]
        if not self.p.log_group:
            raise AwsHostError("set host.aws.log_group to send the container log to CloudWatch")
        ids = [i["InstanceId"] for i in self._find(r, ("pending", "running", "stopping", "stopped"))]
        kw: dict[str, Any] = {"logGroupName": self.p.log_group, "startTime": int((self.clock() - since_s) * 1000),
                              "limit": limit}
        if ids:
            kw["logStreamNames"] = ids
        events = self.client(r, "logs").filter_log_events(**kw).get("events", [])
        return [e["message"].rstrip() for e in sorted(events, key=lambda e: e["timestamp"])][-limit:]

    def plan(self, commands: dict[str, list[str]] | None = None) -> list[str]:
        p = self.p
        lines = [
            f"aws: single-instance {p.instance_type}; regions in order {', '.join(p.regions)} (next region/subnet "
            "on InsufficientInstanceCapacity)",
            "aws: guard: sts:GetCallerIdentity must be " + (p.expected_account_id or f"${p.expected_account_id_env}"),
            f"aws: ssm:GetParameter {p.ami_parameter} (ECS-optimized AL2023 GPU AMI)",
        ]
        for i, (cid, cmd) in enumerate((commands or {"<configuration>": []}).items()):
            verb = "ec2:RunInstances" if i == 0 else "ec2:TerminateInstances + ec2:RunInstances"
            lines.append(f"aws: [{cid}] {verb} {p.instance_type} (user data: docker run {p.image}"
                         + (f" {' '.join(container_argv(cmd)[0])} ..." if cmd else "") + f"; tag {TAG_KEY}={p.name}; "
                         "shutdown behaviour terminate" + (f"; self-shutdown after {p.max_hours:g} h" if p.max_hours
                                                            else "") + ")")
        lines.append(f"aws: tunnel: aws ssm start-session --target <instance> --document-name "
                     f"AWS-StartPortForwardingSession --parameters portNumber={p.container_port},"
                     f"localPortNumber={p.local_port}")
        lines.append(f"aws: stop: ec2:TerminateInstances (tag {TAG_KEY}={p.name}); wait terminated")
        lines.append("aws: " + _guard_line(p) + "; every failure path terminates the instance")
        return lines

    def deploy(self, command: list[str], env: dict[str, str] | None = None) -> HostInfo:
        """Another configuration: a fresh instance (user data runs once)."""
        if self.region:
            self._teardown(self.region)
            if self.teardown_errors:
                raise AwsHostError("could not replace the instance" + self._teardown_note())
            self.region, self.started_at = None, None
        return self.start(command, env)


def make_host(params: AwsParams, session_factory: SessionFactory | None = None, **kw: Any) -> _Base:
    cls = EcsServiceHost if params.mode == "ecs-service" else SingleInstanceHost
    return cls(params, session_factory, **kw)


def aws_params_of(study: Any) -> AwsParams | None:
    host = getattr(study, "host", None)
    aws = getattr(host, "aws", None)
    if aws is None:
        return None
    return aws if isinstance(aws, AwsParams) else AwsParams.model_validate(aws)


def aws_plan_lines(study: Any) -> list[str]:
    """The AWS actions `servelab run --dry-run` prints (no AWS call)."""
    p = aws_params_of(study)
    if p is None:
        return []
    from .engine import build_command
    from .profiles import resolve_profile

    commands = {}
    for c in study.configurations:
        eng = resolve_profile(study, c.id)
        model = eng.model.path if eng.model and eng.model.path else "<model>"
        commands[c.id] = build_command(eng, model, python="python3")
    host = make_host(p, session_factory=lambda r: None)
    return host.plan(commands)
