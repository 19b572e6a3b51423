"""The ECS GPU stack as one CloudFormation stack: plan, up, status, down, logs, tunnel.

templates/ecs-gpu-stack.yaml holds the layout (VPC, NAT gateway or interface endpoints,
internal ALB, ECS cluster + capacity provider on a 0..1 Auto Scaling group of GPU instances,
engine service at desired 0). This module drives it through boto3:

- `plan` prices the template without calling AWS (what `up --dry-run` prints);
  `change_set` asks CloudFormation what would change and deletes the change set again;
- `up` creates or updates the stack and waits; a failed create is deleted and verified empty;
- `status` lists what bills now (billing.find_billable) with the hourly total;
- `down` scales to zero and checks: service 0, refuse if another service shares
  the capacity, ASG 0, delete the stack, then verify that nothing billable is left;
- the deadline AWS enforces itself and `start` are the job of `deadline.py`, above this module.

Every call takes `session_factory(region) -> boto3.Session` (moto sessions in tests) and an
injectable `sleep(seconds)` / `clock() -> seconds`; it builds on `errors`, `session` and
`billing` of this package only.
"""

from __future__ import annotations

import json
import math
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError
from botocore.parsers import ResponseParserError

from .billing import (TAG_STACK, Billable, CostItem, asg_instances, find_billable, hourly_total_usd,
                      load_template, other_services_on, stack_hourly_items, template_resources)
from .errors import Leftovers, SharedCapacity, StackError, StackFailed, StackNotFound
from .session import SessionFactory, StackParams, open_session

TEMPLATE_PATH = Path(__file__).resolve().parent / "templates" / "ecs-gpu-stack.yaml"


@dataclass(frozen=True)
class Plan:
    """Dry-run view: template resources and USD per hour idle (service 0) and running (one task)."""
    resources: list[tuple[str, str]]  # (logical id, type) that the parameters create
    idle_items: list[CostItem]
    running_items: list[CostItem]

    @property
    def idle_hourly_usd(self) -> float:
        return sum(i.usd for i in self.idle_items)

    @property
    def running_hourly_usd(self) -> float:
        return sum(i.usd for i in self.running_items)


def plan(params: StackParams, *, instance_hourly_usd: float | None, template_path: Path | None = None,
         alb_lcu: float = 1.0) -> Plan:
    """What `up` would create and what it costs per hour (USD), without calling AWS.

    `instance_hourly_usd` is the caller's On-Demand price of InstanceType (None: left out of
    the running total and named so). Fixed prices come from aws-fixed-prices.yaml for
    params.region. Raises StackError for unknown parameters, KeyError for a region without
    fixed prices.
    """
    try:
        resources, values = template_resources(params.parameters, template_path or TEMPLATE_PATH)
    except KeyError as e:
        raise StackError(str(e).strip('"')) from e
    common = {"egress": str(values["Egress"]), "root_volume_gib": float(values["RootVolumeGiB"]), "alb_lcu": alb_lcu}
    return Plan(resources,
                stack_hourly_items(params.region, instance_hourly_usd=None, running=False, **common),
                stack_hourly_items(params.region, instance_hourly_usd=instance_hourly_usd, running=True, **common))


def _template_defaults(path: Path | None) -> dict[str, Any]:  # SSM-typed ones re-resolve each update
    spec = load_template(path or TEMPLATE_PATH)["Parameters"]
    return {k: v.get("Default") for k, v in spec.items() if not v["Type"].startswith("AWS::SSM::Parameter::")}


def _cfn_parameters(params: StackParams) -> list[dict[str, str]]:
    return [{"ParameterKey": k, "ParameterValue": ",".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v)}
            for k, v in params.parameters.items()]


def _describe(cf: Any, stack: str) -> dict[str, Any] | None:
    try:
        return cf.describe_stacks(StackName=stack)["Stacks"][0]
    except ClientError as e:
        if "does not exist" in str(e):
            return None
        raise


def outputs(params: StackParams, *, session_factory: SessionFactory | None = None) -> dict[str, str]:
    """The stack's Outputs as {key: value}. Raises StackNotFound, NoCredentials."""
    stack = _describe(open_session(params, session_factory).client("cloudformation"), params.stack_name)
    if stack is None:
        raise StackNotFound(f"stack {params.stack_name} does not exist in {params.region}")
    return {o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs", [])}


def _physical_ids(cf: Any, stack: str) -> dict[str, set[str]]:
    ids: dict[str, set[str]] = {}
    for page in cf.get_paginator("list_stack_resources").paginate(StackName=stack):
        for r in page["StackResourceSummaries"]:
            if r.get("PhysicalResourceId"):
                ids.setdefault(r["ResourceType"], set()).add(r["PhysicalResourceId"])
    return ids


def _failed_events(cf: Any, stack_id: str) -> list[str]:
    """'LogicalId (Type): STATUS - reason' of each failed resource event, oldest (the cause) first."""
    try:
        pages = list(cf.get_paginator("describe_stack_events").paginate(StackName=stack_id))
    except ClientError:  # the stack is already gone: nothing more to tell
        return []
    return [f"{e['LogicalResourceId']} ({e['ResourceType']}): {e['ResourceStatus']} - {e.get('ResourceStatusReason', '')}"
            for page in pages for e in page["StackEvents"] if e.get("ResourceStatus", "").endswith("FAILED")][::-1]


def _wait_stack(cf: Any, stack_id: str, *, sleep: Callable[[float], None], clock: Callable[[], float],
                timeout_s: float, poll_s: float) -> str:
    """Polls until the stack leaves *_IN_PROGRESS; returns the final status (DELETE_COMPLETE if gone)."""
    start = clock()
    while True:
        stack = _describe(cf, stack_id)
        status = stack["StackStatus"] if stack else "DELETE_COMPLETE"
        if not status.endswith("_IN_PROGRESS"):
            return status
        if clock() - start > timeout_s:
            raise StackError(f"stack {stack_id} still {status} after {timeout_s:.0f} s")
        sleep(poll_s)


def up(params: StackParams, *, session_factory: SessionFactory | None = None,
       sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic,
       timeout_s: float = 3600, poll_s: float = 15, template_path: Path | None = None) -> dict[str, str]:
    """Creates (or updates) the stack, waits (at most `timeout_s` seconds) and returns its Outputs.

    A failed create is deleted and checked for billable leftovers; a failed update is rolled
    back by CloudFormation. Raises StackFailed (failed resource events, leftovers), StackError
    (timeout, a stack stuck in a state that needs `down`), NoCredentials.
    """
    session = open_session(params, session_factory)
    cf = session.client("cloudformation")
    body = (template_path or TEMPLATE_PATH).read_text()
    common = {"StackName": params.stack_name, "TemplateBody": body, "Parameters": _cfn_parameters(params),
              "Capabilities": ["CAPABILITY_IAM"], "Tags": [{"Key": TAG_STACK, "Value": params.stack_name}]}
    wait = {"sleep": sleep, "clock": clock, "timeout_s": timeout_s, "poll_s": poll_s}
    existing = _describe(cf, params.stack_name)
    if existing and existing["StackStatus"] in ("ROLLBACK_COMPLETE", "ROLLBACK_FAILED", "DELETE_FAILED",
                                                "CREATE_FAILED", "REVIEW_IN_PROGRESS"):
        raise StackError(f"stack {params.stack_name} is {existing['StackStatus']}: run down first")
    if existing:  # values set by an earlier up and not given now are kept, not reset to defaults
        given, defaults = {p["ParameterKey"] for p in common["Parameters"]}, _template_defaults(template_path)
        common["Parameters"] += [{"ParameterKey": k, "UsePreviousValue": True} for k, v in (
            (p["ParameterKey"], p.get("ParameterValue")) for p in existing.get("Parameters", []))
            if k not in given and k in defaults and str(v) != str(defaults[k])]
        try:
            cf.update_stack(**common)
        except ClientError as e:
            if "No updates are to be performed" in str(e):
                return outputs(params, session_factory=lambda _r: session)
            raise StackFailed(f"update of {params.stack_name} refused: {e}", [], []) from e
        status = _wait_stack(cf, existing["StackId"], **wait)
        if status != "UPDATE_COMPLETE":
            raise StackFailed(f"update of {params.stack_name} ended {status} (CloudFormation rolled it back)",
                              _failed_events(cf, existing["StackId"]), [])
        return outputs(params, session_factory=lambda _r: session)
    cause = ""
    try:  # CloudFormation itself fails (and, OnFailure=DELETE, deletes) a create past the timeout
        stack_id = cf.create_stack(**common, OnFailure="DELETE",
                                   TimeoutInMinutes=max(1, math.ceil(timeout_s / 60)))["StackId"]
        status = _wait_stack(cf, stack_id, **{**wait, "timeout_s": timeout_s + 600})
    except (ClientError, BotoCoreError, ResponseParserError) as e:
        # refused, cut off after AWS got it (the stack may exist), or moto failing a resource inline
        cause, status = str(e), "CREATE_FAILED"
        left = _describe(cf, params.stack_name)
        stack_id = left["StackId"] if left else params.stack_name
    if status == "CREATE_COMPLETE":
        return outputs(params, session_factory=lambda _r: session)
    events = _failed_events(cf, stack_id)
    left = _describe(cf, stack_id)
    ids = _physical_ids(cf, stack_id) if left else {}
    if left and left["StackStatus"] != "DELETE_COMPLETE":  # OnFailure=DELETE normally did this already
        cf.delete_stack(StackName=stack_id)
        _wait_stack(cf, stack_id, **wait)
    leftovers = find_billable(session, params.stack_name, physical_ids=ids)
    detail = "; ".join(events) or cause or status
    raise StackFailed(f"create of {params.stack_name} failed ({detail}); "
                      + ("stack deleted, " if left else "no stack was left, ")
                      + (f"{len(leftovers)} billable leftover(s): " + ", ".join(i.resource_id for i in leftovers)
                         if leftovers else "nothing billable left"), events, leftovers)


def change_set(params: StackParams, *, session_factory: SessionFactory | None = None,
               sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic,
               timeout_s: float = 600, poll_s: float = 5) -> list[dict[str, str]]:
    """What `up` would change, from a CloudFormation change set that is deleted afterwards.

    Returns [{"action", "logical_id", "type", "replacement"}]. For a new stack the change set's
    REVIEW_IN_PROGRESS placeholder stack is deleted too. Raises StackError (timeout, failed
    change set other than "no changes"), NoCredentials.
    """
    session = open_session(params, session_factory)
    cf = session.client("cloudformation")
    existing = _describe(cf, params.stack_name)
    kind = "UPDATE" if existing and existing["StackStatus"] != "REVIEW_IN_PROGRESS" else "CREATE"
    name = f"servelab-preview-{int(time.time())}"
    cs = cf.create_change_set(StackName=params.stack_name, ChangeSetName=name, ChangeSetType=kind,
                              TemplateBody=(TEMPLATE_PATH).read_text(), Parameters=_cfn_parameters(params),
                              Capabilities=["CAPABILITY_IAM"], Tags=[{"Key": TAG_STACK, "Value": params.stack_name}])
    changes: list[dict[str, str]] = []
    try:
        start = clock()
        while True:
            desc = cf.describe_change_set(ChangeSetName=cs["Id"])
            if desc["Status"] in ("CREATE_COMPLETE", "FAILED"):
                break
            if clock() - start > timeout_s:
                raise StackError(f"change set {name} still {desc['Status']} after {timeout_s:.0f} s")
            sleep(poll_s)
        if desc["Status"] == "FAILED" and "didn't contain changes" not in desc.get("StatusReason", ""):
            raise StackError(f"change set failed: {desc.get('StatusReason')}")
        for page in cf.get_paginator("describe_change_set").paginate(ChangeSetName=cs["Id"]):
            for c in page.get("Changes", []):
                rc = c.get("ResourceChange", {})
                changes.append({"action": rc.get("Action", ""), "logical_id": rc.get("LogicalResourceId", ""),
                                "type": rc.get("ResourceType", ""), "replacement": rc.get("Replacement", "")})
    finally:
        cf.delete_change_set(ChangeSetName=cs["Id"])
        if kind == "CREATE":
            cf.delete_stack(StackName=cs["StackId"])
    return changes


def status(params: StackParams, *, session_factory: SessionFactory | None = None,
           instance_hourly_usd: Mapping[str, float] | float | None = None) -> tuple[list[Billable], float]:
    """Billable resources of the stack now (found through its resources, its ASG's instances and
    the servelab:stack tag) and their total USD per hour. Raises StackNotFound when neither the
    stack nor anything tagged with it exists, NoCredentials."""
    session = open_session(params, session_factory)
    cf = session.client("cloudformation")
    stack = _describe(cf, params.stack_name)
    ids: dict[str, set[str]] = {}
    if stack:
        ids = _physical_ids(cf, stack["StackId"])
        ids["instances"] = asg_instances(session, ids.get("AWS::AutoScaling::AutoScalingGroup", set()))
    items = find_billable(session, params.stack_name, physical_ids=ids, instance_hourly_usd=instance_hourly_usd)
    if stack is None and not items:
        raise StackNotFound(f"stack {params.stack_name} does not exist in {params.region} "
                            "(and nothing tagged with it bills)")
    return items, hourly_total_usd(items)


def down(params: StackParams, *, force: bool = False, session_factory: SessionFactory | None = None,
         sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic,
         timeout_s: float = 1800, poll_s: float = 10) -> list[str]:
    """Scale to zero and check, then delete the stack and verify that nothing billable is left.

    Steps (each waited for, at most `timeout_s` seconds in all): service desired 0 and its tasks
    stopped; refuse if another ECS service uses the same capacity provider with desired or
    running > 0 (force=True warns and goes on); ASG min/max/desired 0 and its instances
    terminated; delete the stack; re-list billable resources. Returns the log of steps (one line
    each). Raises SharedCapacity, Leftovers (items still billing), StackNotFound, StackError
    (timeout, stack DELETE_FAILED), NoCredentials.
    """
    session = open_session(params, session_factory)
    cf, ecs, asg = (session.client(s) for s in ("cloudformation", "ecs", "autoscaling"))
    stack = _describe(cf, params.stack_name)
    if stack is None:
        raise StackNotFound(f"stack {params.stack_name} does not exist in {params.region}")
    start, log = clock(), []
    outs = {o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs", [])}
    ids = _physical_ids(cf, stack["StackId"])
    cluster, service = outs.get("ClusterName"), outs.get("ServiceName")

    def waited(what: str, done: Callable[[], bool]) -> None:
        while not done():
            if clock() - start > timeout_s:
                raise StackError(f"down {params.stack_name}: {what} not done after {timeout_s:.0f} s")
            sleep(poll_s)
        log.append(f"{what}: done")

    own = _stop_service(ecs, cluster, service, waited)
    _check_shared_capacity(ecs, cluster, outs, own, params.stack_name, force, log)
    instance_ids = _scale_asg_to_zero(session, asg, ids, outs, waited, log)
    ids["instances"] = instance_ids
    try:
        cf.delete_stack(StackName=stack["StackId"])
    except ClientError as e:
        raise StackError(f"delete of {params.stack_name} refused: {e}") from e
    final = _wait_stack(cf, stack["StackId"], sleep=sleep, clock=clock,
                        timeout_s=max(1.0, timeout_s - (clock() - start)), poll_s=poll_s)
    if final != "DELETE_COMPLETE":
        raise StackError(f"stack {params.stack_name} ended {final}: "
                         + "; ".join(_failed_events(cf, stack["StackId"])))
    log.append(f"stack {params.stack_name} deleted")

    _verify_nothing_left(session, params.stack_name, ids, waited, log)
    return log


def _stop_service(ecs: Any, cluster: str | None, service: str | None,
                  waited: Callable[[str, Callable[[], bool]], None]) -> set[str]:
    """The stack's ECS service at desired 0, its tasks stopped; returns its ARNs (none without one)."""
    own = set()
    if cluster and service:
        svc = ecs.describe_services(cluster=cluster, services=[service])["services"]
        own = {s["serviceArn"] for s in svc}
        if svc and svc[0].get("status") == "ACTIVE":
            ecs.update_service(cluster=cluster, service=service, desiredCount=0)

            def tasks_stopped() -> bool:
                running = [t for page in ecs.get_paginator("list_tasks").paginate(
                    cluster=cluster, serviceName=service, desiredStatus="RUNNING") for t in page["taskArns"]]
                s = ecs.describe_services(cluster=cluster, services=[service])["services"][0]
                return not running and s.get("runningCount", 0) == 0 and s.get("pendingCount", 0) == 0
            waited(f"service {service} desired 0, tasks stopped", tasks_stopped)
    return own


def _check_shared_capacity(ecs: Any, cluster: str | None, outs: dict[str, str], own: set[str], stack_name: str,
                           force: bool, log: list[str]) -> None:
    """SharedCapacity when another service uses the stack's capacity provider (force: a warning)."""
    cps = {outs["CapacityProviderName"]} if outs.get("CapacityProviderName") else set()
    for c in ecs.describe_clusters(clusters=[cluster])["clusters"] if cluster else []:
        cps |= set(c.get("capacityProviders", []))  # the association counts even without the output
    others = other_services_on(ecs, cps, own) if cps else []
    if others:
        msg = (f"capacity provider {', '.join(sorted(cps))} of {stack_name} is still used by "
               f"{'; '.join(others)}")
        if not force:
            raise SharedCapacity(msg + " - stop those first or pass force=True (--force)", others)
        warnings.warn(msg + " - force: scaling the group to 0 and deleting anyway", stacklevel=3)
        log.append(f"WARNING (force): {msg}")


def _scale_asg_to_zero(session: Any, asg: Any, ids: dict[str, set[str]], outs: dict[str, str],
                       waited: Callable[[str, Callable[[], bool]], None], log: list[str]) -> set[str]:
    """The stack's auto-scaling groups at 0 and their instances terminated; returns those instances."""
    asg_names = ids.get("AWS::AutoScaling::AutoScalingGroup", set()) | ({outs["AsgName"]} if outs.get("AsgName") else set())
    instance_ids = asg_instances(session, asg_names)
    for name in sorted(asg_names):
        asg.update_auto_scaling_group(AutoScalingGroupName=name, MinSize=0, MaxSize=0, DesiredCapacity=0)
    if instance_ids:
        ec2 = session.client("ec2")

        def terminated() -> bool:
            pages = ec2.get_paginator("describe_instances").paginate(InstanceIds=sorted(instance_ids))
            return all(i["State"]["Name"] == "terminated" for p in pages for r in p["Reservations"] for i in r["Instances"])
        waited(f"ASG {', '.join(sorted(asg_names))} at 0, {len(instance_ids)} instance(s) terminated", terminated)
    else:
        log.append(f"ASG {', '.join(sorted(asg_names)) or '-'} at 0: no instances")
    return instance_ids


def _verify_nothing_left(session: Any, stack_name: str, ids: dict[str, set[str]],
                         waited: Callable[[str, Callable[[], bool]], None], log: list[str]) -> None:
    """After the delete: deletions in flight waited for, then Leftovers if anything still bills."""
    in_flight = ("deleting", "shutting-down")  # NAT gateways, endpoints, instances pass through these
    waited("deletions in flight finished", lambda: not [
        b for b in find_billable(session, stack_name, physical_ids=ids) if b.state in in_flight])
    left = find_billable(session, stack_name, physical_ids=ids)
    if left:
        raise Leftovers(f"{len(left)} billable resource(s) of {stack_name} survived down "
                        f"({hourly_total_usd(left):.4f} USD/h): " + ", ".join(f"{b.kind} {b.resource_id}" for b in left),
                        left)
    log.append("verified: no instance, NAT gateway, load balancer, EBS volume, EIP or endpoint left")


def logs(params: StackParams, *, since_min: float = 30, session_factory: SessionFactory | None = None,
         now_utc: Callable[[], datetime] = lambda: datetime.now(UTC)) -> list[tuple[datetime, str, str]]:
    """(time UTC, stream, message) of the engine log group for the last `since_min` minutes.

    Raises StackNotFound, NoCredentials."""
    session = open_session(params, session_factory)
    group = outputs(params, session_factory=lambda _r: session).get("LogGroupName")
    if not group:
        raise StackNotFound(f"stack {params.stack_name} has no LogGroupName output")
    start_ms = int((now_utc() - timedelta(minutes=since_min)).timestamp() * 1000)
    paginator = session.client("logs").get_paginator("filter_log_events")
    return [(datetime.fromtimestamp(e["timestamp"] / 1000, UTC), e.get("logStreamName", ""), e["message"])
            for page in paginator.paginate(logGroupName=group, startTime=start_ms) for e in page["events"]]


def tunnel_command(params: StackParams, *, local_port: int = 8080,
                   session_factory: SessionFactory | None = None) -> list[str]:
    """argv of an SSM port forward from localhost:`local_port` to the internal ALB's port 80.

    Goes through a running instance of the stack's ASG (needs the Session Manager plugin).
    Raises StackNotFound, StackError (no running instance: run the service first), NoCredentials.
    """
    session = open_session(params, session_factory)
    outs = outputs(params, session_factory=lambda _r: session)
    ids = asg_instances(session, {outs["AsgName"]} if outs.get("AsgName") else set())
    running = [iid for iid in sorted(ids)
               if session.client("ec2").describe_instances(InstanceIds=[iid])["Reservations"][0]["Instances"][0]
               ["State"]["Name"] == "running"]
    if not running:
        raise StackError(f"no running instance in {outs.get('AsgName')}: start the service (desired 1) first")
    argv = ["aws", "ssm", "start-session", "--region", params.region, "--target", running[0],
            "--document-name", "AWS-StartPortForwardingSessionToRemoteHost", "--parameters",
            json.dumps({"host": [outs["LoadBalancerDns"]], "portNumber": ["80"], "localPortNumber": [str(local_port)]})]
    return argv + (["--profile", params.profile] if params.profile else [])
