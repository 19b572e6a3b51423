"""What both AWS hosts share (`BotoHost`, the base of ecs.EcsServiceHost and
instance.SingleInstanceHost): the host record, the guards (expected account, spend and time
limits, a watchdog thread), the region loop that moves on when GPU capacity is short and tears
down on every failure, and the container's argv. The SSM port forward is `tunnel.py`. Every call goes through an injectable
boto3 Session factory (moto in tests) and an injectable clock and sleep. Not for prices
(`servelab.prices`) or measuring (`measure`)."""

from __future__ import annotations

import os
import re
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable

from ...prices import default_cache_dir, ec2_hourly_usd
from ...schema import AwsParams
from .errors import (AccountMismatch, AwsHostError, CapacityUnavailable, GuardTripped, HostTimeout, NotDeployed,
                     RegionCapacity)
from .session import SessionFactory

CAPACITY_CODES = {"InsufficientInstanceCapacity", "InsufficientCapacity", "InsufficientHostCapacity",
                  "Unsupported", "InstanceLimitExceeded", "VcpuLimitExceeded", "InsufficientCapacityOnHost",
                  "MaxSpotInstanceCountExceeded", "UnfulfillableCapacity"}

CAPACITY_TEXT = re.compile(
    r"InsufficientInstanceCapacity|insufficient capacity|do not have sufficient [\w.-]+ capacity|"
    r"not supported in your requested Availability Zone|\bUnsupported\b|VcpuLimitExceeded|vCPU capacity|"
    r"InstanceLimitExceeded|UnfulfillableCapacity", re.I)

TAG_KEY = "servelab:host"


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
    #: the AWS-enforced deadline set before the engine started ({"utc", "hours", "why", ...})
    deadline: dict[str, Any] | None = None

    def record(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items()}



def epoch(t: Any) -> float | None:
    if t is None:
        return None
    if isinstance(t, datetime):
        return (t if t.tzinfo else t.replace(tzinfo=timezone.utc)).timestamp()
    return float(t)


def err_code(e: BaseException) -> str:
    return str(getattr(e, "response", {}).get("Error", {}).get("Code", "")) if hasattr(e, "response") else ""


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


class BotoHost:
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
        #: set the deadline AWS enforces itself on start (AwsHost sets it; the region's limit_hours)
        self.arm_deadline = False
        self.deadline: dict[str, Any] | None = None

    def _default_factory(self, region: str) -> Any:
        import boto3

        return boto3.Session(profile_name=self.p.profile, region_name=region)

    def session(self, region: str) -> Any:
        """The region's boto3 session (made once; shared with the watchdog thread under the lock)."""
        with self._lock:
            if region not in self._sessions:
                self._sessions[region] = self._factory(region)
            return self._sessions[region]

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

    def watchdog(self, interval_s: float = 60.0, sync: Callable[[], None] | None = None,
                 on_trip: Callable[[GuardTripped], None] | None = None) -> "Watchdog":
        """A daemon thread calling guard() every interval (after `sync()`, which may load the
        region and start time another process recorded); stops the host when a limit trips,
        then calls `on_trip(error)` (AwsHost: end the run in the main thread)."""
        return Watchdog(self, interval_s, sync, on_trip)

    # -- the deadline AWS enforces ---------------------------------------------------------
    def limit_hours(self, region: str | None) -> tuple[float, str]:
        """(hours, why) the run may last: max_hours, or what max_spend_usd buys at the region's
        hourly price, the earlier. Raises AwsHostError when neither can be computed."""
        options = []
        if self.p.max_hours:
            options.append((self.p.max_hours, f"max_hours {self.p.max_hours:g}"))
        if self.p.max_spend_usd and region:
            try:
                hourly = self.hourly_usd(region)
                options.append((self.p.max_spend_usd / hourly,
                                f"max_spend_usd {self.p.max_spend_usd:g} at {hourly:g} USD/h"))
            except Exception as e:  # noqa: BLE001 - max_hours alone still gives a deadline
                if not options:
                    raise AwsHostError(f"no deadline: max_spend_usd needs the hourly price in {region} ({e})") from e
        if not options:
            raise AwsHostError("no deadline: set host.aws.max_hours or max_spend_usd")
        return min(options)

    def deadline_record(self, region: str) -> dict[str, Any] | None:
        """The deadline of a start now in `region` ({"hours", "why", "utc"}), or None when
        AwsHost asked for none (arm_deadline unset)."""
        if not self.arm_deadline:
            return None
        hours, why = self.limit_hours(region)
        when = datetime.fromtimestamp(self.clock() + hours * 3600, timezone.utc).replace(microsecond=0)
        return {"hours": hours, "why": why, "utc": when.isoformat()}

    def clear_deadline(self, deadline: dict[str, Any] | None) -> str | None:
        """Remove a deadline this host set (after a clean stop); returns what was done."""
        return None

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
            except NotDeployed as e:
                self.attempts.append((region, str(e)))
                self.log(f"{region}: {e}")
                continue
            except RegionCapacity as e:
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


class Watchdog:
    def __init__(self, host: BotoHost, interval_s: float, sync: Callable[[], None] | None = None,
                 on_trip: Callable[[GuardTripped], None] | None = None) -> None:
        self.host, self.interval_s, self.sync, self.on_trip = host, interval_s, sync, on_trip
        self._stop = threading.Event()
        self.error: BaseException | None = None
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                if self.sync:
                    self.sync()
                self.host.guard()
            except GuardTripped as e:
                self.error = e
                if self.on_trip:
                    self.on_trip(e)
                return
            except Exception as e:  # noqa: BLE001 - keep watching through transient API errors
                self.host.log(f"watchdog: {type(e).__name__}: {e}")

    def __enter__(self) -> "Watchdog":
        self._t.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._t.join(5)


def guard_line(p: AwsParams) -> str:
    parts = []
    if p.max_hours:
        parts.append(f"{p.max_hours:g} h")
    if p.max_spend_usd:
        parts.append(f"${p.max_spend_usd:g}")
    return "limit: stop after " + " or ".join(parts) + " (elapsed hours x hourly price)"
