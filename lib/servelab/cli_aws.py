"""`servelab aws up|start|status|logs|tunnel|down`: the ECS GPU CloudFormation stack from the command line.

`add_parser(subparsers)` registers the `aws` command on the main parser's subparsers; every
subcommand calls servelab.hosts.aws (`stack`, `deadline`) and prints one clear line (exit 1) when
credentials are missing, the stack does not exist or AWS refuses. `status` ends with one line that
answers "is anything still running and billing me?". Not for logic: that is the package's.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import warnings
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from .hosts.aws import deadline
from .hosts.aws import stack
from .hosts.aws.billing import Billable
from .hosts.aws.errors import Leftovers, StackError
from .hosts.aws.session import StackParams
from .prices import PriceError, table_price

EXIT_FAIL = 1


def committed_instance_usd_per_hour(instance_type: str, region: str) -> float | None:
    """On-Demand USD/h of `instance_type` in `region` by the one lookup every command uses
    (`prices.table_price`: the committed table, a us-east-1 entry standing in for another region),
    or None when the table has no verified price."""
    try:
        return table_price(instance_type, region).usd_per_hour
    except PriceError:
        return None


def _params(a: argparse.Namespace) -> StackParams:
    values: dict[str, Any] = {}
    for kv in getattr(a, "param", None) or []:
        key, sep, value = kv.partition("=")
        if not sep:
            raise StackError(f"--param wants KEY=VALUE, got {kv!r}")
        values[key] = value
    for attr, key in (("instance_type", "InstanceType"), ("image", "EngineImage"), ("command", "EngineCommand"),
                      ("gpus", "GpuCount"), ("egress", "Egress")):
        if getattr(a, attr, None) is not None:
            values[key] = getattr(a, attr)
    return StackParams(a.stack, a.region, values, a.profile)


def _price(a: argparse.Namespace, instance_type: str) -> float | None:
    if getattr(a, "instance_usd_per_hour", None) is not None:
        return a.instance_usd_per_hour
    return committed_instance_usd_per_hour(instance_type, a.region)


def _cmd_up(a: argparse.Namespace) -> int:
    p = _params(a)
    itype = str(p.parameters.get("InstanceType", "g7e.12xlarge"))
    if a.dry_run:
        pl = stack.plan(p, instance_hourly_usd=_price(a, itype))
        print(f"stack {p.stack_name} in {p.region}: {len(pl.resources)} resources (no AWS call made)")
        for lid, rtype in pl.resources:
            print(f"  {lid:28s} {rtype}")
        for label, items, total in (("idle (service 0)", pl.idle_items, pl.idle_hourly_usd),
                                    (f"running (1 x {itype})", pl.running_items, pl.running_hourly_usd)):
            unknown = any(i.basis == "unknown" for i in items)
            print(f"hourly cost {label}: {total:.4f} USD/h" + (" + the instance (price unknown: pass "
                                                               "--instance-usd-per-hour)" if unknown else ""))
            for i in items:
                print(f"  {i.name:44s} {i.usd:10.4f}  ({i.basis})")
        print("fixed prices: data/aws-fixed-prices.yaml (status quoted: list prices, check before publishing)")
        return 0
    if a.change_set:
        for c in stack.change_set(p):
            print(f"{c['action']:8s} {c['logical_id']:28s} {c['type']:45s} {c['replacement']}")
        return 0
    outs = stack.up(p)
    for k, v in sorted(outs.items()):
        print(f"{k}: {v}")
    if a.deadline_hours:
        when = datetime.now(UTC) + timedelta(hours=a.deadline_hours)
        deadline.set_deadline(outs["AsgName"], when, region=p.region, profile=p.profile)
        print(f"deadline: {outs['AsgName']} scales to 0 at {when.isoformat(timespec='seconds')} (servelab-deadline)")
    return 0


def _print_items(items: list[Billable], total: float) -> None:
    for b in items:
        print(b.line())
    unknown = sum(1 for b in items if b.hourly_usd is None)
    print(f"total: {total:.4f} USD/h" + (f" (+{unknown} item(s) of unknown price)" if unknown else ""))


def billing_line(stack: str, items: list[Billable], total: float, deadline: datetime | None = None) -> str:
    """One line: is anything still running and billing? (GPU instances first, then the idle stack)."""
    gpus = [b for b in items if b.kind == "instance" and b.state in ("pending", "running", "stopping",
                                                                      "shutting-down")]
    unknown = " + unknown prices" if any(b.hourly_usd is None for b in items) else ""
    when = f"; AWS deadline scales it to 0 at {deadline.isoformat(timespec='seconds')}" if deadline else \
        ("; NO AWS deadline set (servelab aws start sets one)" if gpus else "")
    if gpus:
        what = ", ".join(f"{b.resource_id} {b.detail}" for b in gpus)
        return f"BILLING: {len(gpus)} GPU instance(s) running ({what}); {total:.4f} USD/h in all{unknown}{when}"
    if items:
        kinds = ", ".join(sorted({b.kind for b in items}))
        return (f"no GPU instance running; the idle stack still bills {total:.4f} USD/h{unknown} ({kinds}): "
                f"servelab aws down --stack {stack} removes it{when}")
    return f"nothing of stack {stack} bills now{when}"


def _deadline(p: StackParams) -> datetime | None:
    try:
        asg = stack.outputs(p).get("AsgName")
        got = deadline.deadline_of(asg, region=p.region, profile=p.profile) if asg else None
    except (StackError, ClientError):
        return None
    return (got or {}).get("scheduled_utc")


def _cmd_status(a: argparse.Namespace) -> int:
    p = _params(a)
    items, total = stack.status(p, instance_hourly_usd=a.instance_usd_per_hour)
    if a.instance_usd_per_hour is None:  # price each instance type from the committed table
        priced = {b.detail.split()[0]: committed_instance_usd_per_hour(b.detail.split()[0], p.region)
                  for b in items if b.kind == "instance"}
        if any(v is not None for v in priced.values()):
            items, total = stack.status(p, instance_hourly_usd={k: v for k, v in priced.items() if v is not None})
    print(f"stack {p.stack_name} in {p.region}: {len(items)} billable resource(s)")
    _print_items(items, total)
    print(billing_line(p.stack_name, items, total, _deadline(p)))
    return 0


def _cmd_start(a: argparse.Namespace) -> int:
    for line in deadline.start(_params(a), deadline_hours=a.deadline_hours):
        print(line)
    return 0


def _cmd_logs(a: argparse.Namespace) -> int:
    for when, stream, message in stack.logs(_params(a), since_min=a.since):
        print(f"{when.isoformat(timespec='seconds')} {stream} {message.rstrip()}")
    return 0


def _cmd_tunnel(a: argparse.Namespace) -> int:
    argv = stack.tunnel_command(_params(a), local_port=a.local_port)
    print(shlex.join(argv))
    if a.start:
        return subprocess.call(argv)
    return 0


def _cmd_down(a: argparse.Namespace) -> int:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        log = stack.down(_params(a), force=a.force)
    for w in caught:
        print(f"warning: {w.message}", file=sys.stderr)
    for line in log:
        print(line)
    return 0


def _guarded(fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    def run(a: argparse.Namespace) -> int:
        try:
            return fn(a)
        except Leftovers as e:
            print(f"servelab aws {a.aws_command}: {e}", file=sys.stderr)
            for b in e.items:
                print(f"  {b.line()}", file=sys.stderr)
            return EXIT_FAIL
        except (StackError, ValueError, KeyError) as e:
            print(f"servelab aws {a.aws_command}: {str(e).strip(chr(34))}", file=sys.stderr)
            return EXIT_FAIL
        except ClientError as e:
            err = e.response.get("Error", {})
            print(f"servelab aws {a.aws_command}: AWS refused {e.operation_name}: {err.get('Code')}: "
                  f"{err.get('Message')}", file=sys.stderr)
            return EXIT_FAIL
        except BotoCoreError as e:  # NoCredentialsError, EndpointConnectionError, ...
            print(f"servelab aws {a.aws_command}: {e}", file=sys.stderr)
            return EXIT_FAIL
    return run


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Registers `aws` with up/status/logs/tunnel/down on `subparsers` (from add_subparsers()).

    Each subcommand sets `func(namespace) -> exit code`. Returns the `aws` parser.
    """
    aws = subparsers.add_parser("aws", help="the ECS GPU CloudFormation stack (up, start, status, logs, tunnel, down)")
    sub = aws.add_subparsers(dest="aws_command", required=True)

    def common(name: str, help_: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_)
        p.add_argument("--stack", required=True, metavar="NAME", help="CloudFormation stack name")
        p.add_argument("--region", default="us-east-1")
        p.add_argument("--profile", default=None, help="AWS profile (default: the environment's)")
        return p

    up = common("up", "create or update the stack (service at 0: no GPU yet)")
    up.add_argument("--instance-type", default=None, help="InstanceType (default g7e.12xlarge)")
    up.add_argument("--image", default=None, help="EngineImage")
    up.add_argument("--command", default=None, help="EngineCommand, comma-separated argv")
    up.add_argument("--gpus", type=int, default=None, help="GpuCount")
    up.add_argument("--egress", choices=["nat", "endpoints"], default=None)
    up.add_argument("--param", action="append", metavar="KEY=VALUE", help="any other template parameter")
    up.add_argument("--instance-usd-per-hour", type=float, default=None,
                    help="instance price for --dry-run (default: data/prices.yaml)")
    up.add_argument("--dry-run", action="store_true", help="list resources and hourly cost; no AWS call")
    up.add_argument("--change-set", action="store_true", help="show CloudFormation's change set, then delete it")
    up.add_argument("--deadline-hours", type=float, default=None,
                    help="schedule the ASG to 0 this many hours from now (survives servelab dying)")
    up.set_defaults(func=_guarded(_cmd_up))

    start = common("start", "service desired 1 with a new AWS-enforced deadline (restores MaxSize after one fired)")
    start.add_argument("--deadline-hours", type=float, default=8.0,
                       help="the ASG scales to 0 this many hours from now, servelab alive or not (default 8)")
    start.set_defaults(func=_guarded(_cmd_start))

    status = common("status", "billable resources of the stack, their hourly total, and one line: billing or not")
    status.add_argument("--instance-usd-per-hour", type=float, default=None)
    status.set_defaults(func=_guarded(_cmd_status))

    logs = common("logs", "engine log events from CloudWatch")
    logs.add_argument("--since", type=float, default=30, metavar="MINUTES")
    logs.set_defaults(func=_guarded(_cmd_logs))

    tunnel = common("tunnel", "SSM port forward to the internal ALB through a running instance")
    tunnel.add_argument("--local-port", type=int, default=8080)
    tunnel.add_argument("--start", action="store_true", help="run the session (needs the Session Manager plugin)")
    tunnel.set_defaults(func=_guarded(_cmd_tunnel))

    down = common("down", "service 0, ASG 0, delete the stack, verify nothing billable is left")
    down.add_argument("--force", action="store_true", help="go on although another service shares the capacity")
    down.set_defaults(func=_guarded(_cmd_down))
    for p in sub.choices.values():  # servelab.cli's main() calls `fn`
        p.set_defaults(fn=p.get_default("func"))
    return aws
