"""The AWS hosts as the pipeline sees them (`host.kind` aws-ecs or aws-instance): the first
configuration creates the study's stack when it names one (host.aws.stack), sets the deadline
AWS enforces itself (the Auto Scaling group to 0 at start + max_hours, or what max_spend_usd
buys) and starts the GPU host; later ones switch it to their engine command (a new task
definition on the same instance); the study's end (and every failure or signal) stops it and,
after a clean stop, clears the deadline. The spend/time watchdog runs for the whole `servelab
run`; when it trips it stops the host and ends the run in the main thread (run.json partial,
the guard's reason). AWS credentials are read (and enter the scrub list) before anything starts.
The boto3 work is in `ecs.py` / `instance.py` / `stack.py` of this package; this module is
its top (nothing here imports it back)."""

from __future__ import annotations

import _thread
import contextlib
import signal
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from ...log import progress_line
from ...engines import get as engine_profile
from ...prices import PriceError, ec2_hourly_usd
from ...runfolder import HOST_JSON, RUN_JSON, read_json, write_json
from ...schema import AttachParams, AwsParams, EngineParams, Study
from ...secrets import aws_secret_values
from ..attach import attach
from ..base import Host
from .base import BotoHost
from .ecs import EcsServiceHost
from .errors import AwsHostError, StackNotFound
from .instance import SingleInstanceHost
from .remote import InstanceRunnerHost, runner_argv
from .plan import deadline_line, stack_lines
from .session import SessionFactory, StackParams
from .tunnel import open_tunnel

AWS_CLASSES = {"aws-ecs": EcsServiceHost, "aws-instance": SingleInstanceHost}


def make_host(params: AwsParams, kind: str = "aws-ecs", session_factory: SessionFactory | None = None,
              **kw: Any) -> BotoHost:
    """The boto3 host of `host.kind` (aws-ecs: the ECS stack; aws-instance: one instance, which runs the study
    runner itself with `runner: instance`)."""
    if params.runner == "instance":
        if kind != "aws-instance":
            raise AwsHostError(f"host.aws.runner: instance needs host.kind aws-instance, not {kind}")
        return InstanceRunnerHost(params, session_factory, **kw)
    return AWS_CLASSES[kind](params, session_factory, **kw)


def engine_command(eng: EngineParams) -> list[str]:
    """A configuration's container command from its resolved engine set-up (derived values applied)."""
    model = (eng.model.path or eng.model.preset) if eng.model else "<model>"
    return engine_profile(eng.kind).command(eng, str(model), python="python3")


def engine_commands(engines: Mapping[str, EngineParams]) -> dict[str, list[str]]:
    """Each configuration's container command ({config id: resolved EngineParams} in, same keys out)."""
    return {cid: engine_command(eng) for cid, eng in engines.items()}


class AwsHost(Host):
    launches_engine = True
    cost_basis = "instance"
    watchdog_interval_s = 60.0

    kinds = ("aws-ecs", "aws-instance")

    def __init__(self, study: Study, kind: str | None = None) -> None:
        super().__init__(study)
        self.kind = kind or study.host.kind
        assert study.host.aws is not None
        self.params = study.host.aws
        self._host: BotoHost | None = None
        self._credentials_read = False
        #: the watchdog's reason when it stopped the host during this run
        self.tripped: str | None = None

    def boto_host(self) -> BotoHost:
        if self._host is None:
            self._host = make_host(self.params, self.kind, log=lambda m: progress_line(f"aws: {m}"))
            self._sync()
        return self._host

    def _sync(self) -> None:
        """Region, start time, deadline and the stack's outputs from the state file: the stage
        that started the host may have run in another process (a papermill kernel)."""
        if self._host is not None and self.state_path().exists():
            prev = read_json(self.state_path())
            self._host.region, self._host.started_at = prev["region"], prev["started_at"]
            self._host.deadline = prev.get("deadline")
            if prev.get("resolved"):
                self._host.p = self._host.p.model_copy(update=prev["resolved"])

    def check(self) -> None:
        """Before anything starts: the AWS credentials must be readable (they enter the scrub list)."""
        self.credentials()

    def credentials(self) -> None:
        """Read the profile's / environment's AWS credentials into the scrub list; raises
        secrets.AwsCredentialsError (with what to do) when they cannot be read."""
        if not self._credentials_read:
            aws_secret_values(self.params.profile)
            self._credentials_read = True

    def _stack_up(self, h: BotoHost, create: bool = True) -> dict[str, Any]:
        """Create (or update, or only read: create=False) the study's stack; its outputs replace
        cluster, service, group, capacity provider and target group, and the run stays in its
        region. Raises errors.StackError (StackFailed, StackNotFound, NoCredentials)."""
        s = self.params.stack
        if s is None:
            return {}
        from .stack import outputs as stack_outputs  # botocore: only a study with a stack needs it
        from .stack import up as stack_up

        region = self.params.stack_region
        sp = StackParams(s.name, region, {"InstanceType": self.params.instance_type, **s.parameters},
                                   self.params.profile)
        h.check_account()  # nothing is created in the wrong account
        if s.create and create:
            h.log(f"{region}: cloudformation: create or update stack {s.name}")
            outs = stack_up(sp, session_factory=h.session, sleep=h.sleep, clock=h.clock)
        else:
            outs = stack_outputs(sp, session_factory=h.session)
        resolved = {"regions": [region], "cluster": outs.get("ClusterName"), "service": outs.get("ServiceName"),
                    "asg_name": outs.get("AsgName"), "capacity_provider": outs.get("CapacityProviderName"),
                    "target_group_arn": outs.get("TargetGroupArn"), "log_group": outs.get("LogGroupName"),
                    "container_name": "engine"}  # the template's container
        resolved = {k: v for k, v in resolved.items() if v}
        h.p = h.p.model_copy(update=resolved)
        return resolved

    def _provision(self, config_id: str, rdir: Path, engine: EngineParams) -> dict[str, Any]:
        """Start the AWS host with this configuration's engine command (the stack first when the
        study names one, the AWS-enforced deadline before the engine starts), or switch the
        running one to it. The host stays up for the next configuration; `teardown` ends it."""
        self.credentials()
        eng = engine
        cmd = engine_command(engine)
        h = self.boto_host()
        state = self.state_path()
        if state.exists():
            h.guard()  # stops the host and raises once max_hours / max_spend_usd is reached
            info = h.deploy(cmd, dict(eng.env))
            write_json(state, {**read_json(state), "config": config_id})
        else:
            resolved = self._stack_up(h)
            h.arm_deadline = True  # the deadline AWS enforces, set before the service scales out
            info = h.start(cmd, dict(eng.env))
            write_json(state, {"region": info.region, "started_at": info.started_at, "config": config_id,
                               "deadline": info.deadline, "resolved": resolved})
        return {"aws": info.record(), "url": info.url, "tunnel": info.tunnel, "command": cmd,
                "deadline": info.deadline, "stack": self.params.stack.name if self.params.stack else None}

    @property
    def runs_remotely(self) -> bool:
        """`runner: instance`: the whole study runs on the instance (`run_there`), not configuration by
        configuration from here."""
        return self.params.runner == "instance"

    def run_there(self, study_id: str, params_path: Path, configs: list[str], *, reduced: bool,
                  stop_after_s: float | None, force: bool) -> int:
        """`runner: instance`: the inputs up, the instance started with the study runner (the AWS-enforced
        deadline first), its log followed under the guard, its runs unpacked into runs/<study>/. Returns the
        instance's `servelab run` exit status; `teardown` terminates the instance as for every AWS study."""
        self.credentials()
        h = self.boto_host()
        assert isinstance(h, InstanceRunnerHost)
        h.check_account()  # nothing goes up to, or starts in, the wrong account
        h.upload(study_id, params_path)
        h.arm_deadline = True
        info = h.start(runner_argv(configs, reduced=reduced, stop_after_s=stop_after_s, force=force), {})
        write_json(self.state_path(), {"region": info.region, "started_at": info.started_at, "config": None,
                                       "deadline": info.deadline, "resolved": {}})
        progress_line(f"aws: {info.region}: {info.instance_ids[0]} runs the study ({h.url}/)")
        try:
            code = h.follow(info.instance_ids[0], say=progress_line, guard=h.guard)
        finally:
            got = h.fetch_runs(self.state_path().parent)
            shown = [g for g in got if "." not in g]  # run folders, not design.json nor the runner's .served/
            progress_line(f"aws: runs brought back: {', '.join(shown) or 'none'}")
        return code

    def launch(self, config_id: str, rdir: Path, engine: EngineParams) -> dict[str, Any]:
        """Reach the engine the AWS host runs: through the SSM port forward when there is one."""
        host = read_json(rdir / HOST_JSON)
        url, tunnel_pid = host.get("url"), None
        if host.get("tunnel"):
            port = self.params.local_port
            tunnel_pid = open_tunnel(host["tunnel"], port).pid
            url = f"http://127.0.0.1:{port}"
        srv = attach(AttachParams(url=url), engine.kind)
        info = {**srv.info, "command": host.get("command"), "aws": host.get("aws")}
        return {"mode": "aws", "base_url": srv.base_url, "model": srv.model, "info": info, "tokenizer_dir": None,
                "tunnel_pid": tunnel_pid}

    def client_headers(self, config_id: str, handle: dict[str, Any]) -> dict[str, str]:
        return {}

    @contextlib.contextmanager
    def guard(self) -> Iterator[None]:
        """The spend/time watchdog for the whole run: it stops the host from its own thread when
        max_hours or max_spend_usd is reached, also in the middle of a benchmark, then ends the
        run in the main thread (`_on_trip`)."""
        h = self.boto_host()
        with h.watchdog(self.watchdog_interval_s, sync=self._sync, on_trip=self._on_trip) \
                if hasattr(h, "watchdog") else contextlib.nullcontext():
            yield

    def _on_trip(self, err: BaseException) -> None:
        """The watchdog stopped the host: end the run now. SIGTERM to the main thread is what the
        benchmark (its asyncio handler) and the pipeline (stop_signals) end a run on; where no
        handler is installed, a KeyboardInterrupt. `teardown` then puts the reason in run.json."""
        self.tripped = str(err)
        if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, signal.SIG_IGN, None):
            _thread.interrupt_main()
        else:
            signal.pthread_kill(threading.main_thread().ident, signal.SIGTERM)

    def _note_trip(self, config_id: str | None) -> None:
        """run.json of the configuration the guard cut short: partial, with the guard's reason."""
        if not self.tripped or not config_id:
            return
        p = self.state_path().parent / config_id / RUN_JSON
        if not p.exists():
            return
        run = read_json(p)
        if run.get("status") in ("running", "partial") and not run.get("guard_tripped"):
            run.update(status="partial", guard_tripped=self.tripped,
                       message=f"stopped by the AWS guard ({self.tripped}); " + str(run.get("message") or ""))
            write_json(p, run)

    def teardown(self) -> str:
        """Stop the study's AWS host (idempotent); after the study and on every failure. Once the
        stop has finished (group at 0, instances terminated) the deadline is cleared; when the
        stop fails it stays, the safety net."""
        state = self.state_path()
        prev = read_json(state) if state.exists() else {}
        h = self.boto_host()
        if self.params.stack and not h.p.service:  # the stack's outputs were read in another process, or never
            try:
                self._stack_up(h, create=False)
            except StackNotFound:
                return f"AWS host: stack {self.params.stack.name} does not exist: nothing to stop"
        out = h.stop(prev.get("region"))  # raises on failure: state file and deadline stay
        msg = f"AWS host stopped: {out}"
        deadline = prev.get("deadline") or h.deadline
        if deadline:
            try:
                cleared = h.clear_deadline(deadline)
            except Exception as e:  # noqa: BLE001 - the group is at 0 already: a late deadline is harmless
                cleared = f"deadline NOT cleared ({type(e).__name__}: {e}); it stays on the group"
            if cleared:
                msg += f"; {cleared}"
        self._note_trip(prev.get("config"))
        state.unlink(missing_ok=True)
        return msg

    def _dry_price(self) -> float | None:
        """The instance price the dry run uses: host.aws.hourly_usd or the committed table."""
        if self.params.hourly_usd:
            return self.params.hourly_usd
        try:
            return ec2_hourly_usd(self.params.instance_type, self.params.stack_region or self.params.regions[0],
                                  use_api=False).usd_per_hour
        except PriceError:
            return None

    def plan_lines(self, engines: Mapping[str, EngineParams]) -> list[str]:
        price = self._dry_price()
        h = make_host(self.params, self.kind, session_factory=lambda r: None)
        return (stack_lines(self.params, price) + h.plan(engine_commands(engines))
                + [deadline_line(self.params, self.kind, price)])
