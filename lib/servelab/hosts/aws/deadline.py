"""The stack's AWS-enforced deadline and `start`: what keeps the GPUs from billing when
servelab is gone.

- `set_deadline` leaves an Auto Scaling scheduled action (servelab-deadline) that takes the
  group to min/max/desired 0 at a UTC time, and tags the group servelab:deadline; AWS runs it
  even when servelab dies mid-benchmark;
- `clear_deadline` removes both after a clean stop; `deadline_of` reads them back;
- `start` brings the stack back up: restore the group's MaxSize when a deadline fired
  (MaxSize 0 keeps the capacity provider from scaling out), set a new deadline, service
  desired 1.

`arm_group` / `clear_group` do the same for the pipeline's ECS host (ecs.EcsServiceHost):
the deadline is set before the service asks for an instance and cleared after a clean stop.

Above `stack` (it reads the stack's outputs); every call takes
`session_factory(region) -> boto3.Session` and an injectable `now_utc()`.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from botocore.exceptions import ClientError

from .errors import StackError
from .session import SessionFactory, StackParams, open_session
from .stack import outputs

TAG_DEADLINE = "servelab:deadline"
DEADLINE_ACTION = "servelab-deadline"


def _utcnow() -> datetime:
    return datetime.now(UTC)


def set_deadline(asg_name: str, deadline_utc: datetime, *, region: str, profile: str | None = None,
                 session_factory: SessionFactory | None = None,
                 now_utc: Callable[[], datetime] = _utcnow) -> None:
    """Schedules the ASG to min/max/desired 0 at `deadline_utc` and tags it servelab:deadline.

    The scheduled action (servelab-deadline) runs inside AWS, so the GPUs stop even if servelab
    dies; MaxSize 0 also stops the capacity provider from scaling back out (up/start must
    restore MaxSize). Raises ValueError for a naive or past deadline (AWS wants a future
    StartTime), NoCredentials, botocore ClientError (unknown group).
    """
    if deadline_utc.tzinfo is None:
        raise ValueError("deadline_utc must be timezone-aware (UTC)")
    if deadline_utc <= now_utc() + timedelta(seconds=60):
        raise ValueError(f"deadline {deadline_utc.isoformat()} is not at least a minute in the future")
    asg = open_session(StackParams("-", region, profile=profile), session_factory).client("autoscaling")
    when = deadline_utc.astimezone(UTC).replace(microsecond=0)
    asg.put_scheduled_update_group_action(AutoScalingGroupName=asg_name, ScheduledActionName=DEADLINE_ACTION,
                                          StartTime=when, MinSize=0, MaxSize=0, DesiredCapacity=0)
    asg.create_or_update_tags(Tags=[{"ResourceId": asg_name, "ResourceType": "auto-scaling-group",
                                     "Key": TAG_DEADLINE, "Value": when.isoformat(), "PropagateAtLaunch": False}])


def clear_deadline(asg_name: str, *, region: str, profile: str | None = None,
                   session_factory: SessionFactory | None = None) -> None:
    """Removes the servelab-deadline scheduled action and tag (missing ones are fine). Raises NoCredentials."""
    asg = open_session(StackParams("-", region, profile=profile), session_factory).client("autoscaling")
    try:
        asg.delete_scheduled_action(AutoScalingGroupName=asg_name, ScheduledActionName=DEADLINE_ACTION)
    except ClientError as e:
        if "not found" not in str(e).lower() and "does not exist" not in str(e).lower():
            raise
    asg.delete_tags(Tags=[{"ResourceId": asg_name, "ResourceType": "auto-scaling-group", "Key": TAG_DEADLINE}])


def deadline_of(asg_name: str, *, region: str, profile: str | None = None,
                session_factory: SessionFactory | None = None) -> dict[str, datetime | None] | None:
    """{"scheduled_utc": the action's StartTime, "tag_utc": the tag's time} (UTC datetimes) or None
    without either. Raises NoCredentials, botocore ClientError."""
    asg = open_session(StackParams("-", region, profile=profile), session_factory).client("autoscaling")
    actions = [a for page in asg.get_paginator("describe_scheduled_actions").paginate(
        AutoScalingGroupName=asg_name, ScheduledActionNames=[DEADLINE_ACTION]) for a in page["ScheduledUpdateGroupActions"]]
    groups = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[asg_name])["AutoScalingGroups"]
    tag = next((t["Value"] for g in groups for t in g.get("Tags", []) if t["Key"] == TAG_DEADLINE), None)
    if not actions and tag is None:
        return None
    scheduled = actions[0]["StartTime"].astimezone(UTC) if actions else None
    return {"scheduled_utc": scheduled, "tag_utc": datetime.fromisoformat(tag) if tag else None}


def restore_max_size(asg: Any, asg_name: str, max_size: int = 1) -> str | None:
    """MaxSize back to `max_size` when a fired deadline (or `down`) left it at 0; returns the log
    line, or None when the group could already scale out. Raises botocore ClientError."""
    groups = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[asg_name])["AutoScalingGroups"]
    if not groups:
        raise StackError(f"Auto Scaling group {asg_name} not found")
    if groups[0].get("MaxSize", 0) >= max_size:
        return None
    asg.update_auto_scaling_group(AutoScalingGroupName=asg_name, MaxSize=max_size)
    return f"ASG {asg_name} MaxSize {groups[0].get('MaxSize', 0)} -> {max_size} (a deadline or down had set 0)"


def start(params: StackParams, *, deadline_hours: float, session_factory: SessionFactory | None = None,
          now_utc: Callable[[], datetime] = _utcnow) -> list[str]:
    """Service desired 1 with a new AWS-enforced deadline `deadline_hours` from now.

    Restores the group's MaxSize to 1 when a fired deadline left it at 0, sets the deadline
    before the service asks for an instance, then ecs:UpdateService desiredCount=1 (the
    capacity provider scales the group 0 -> 1; `status` shows the progress). Returns the log
    (one line per step). Raises ValueError (deadline_hours <= 0), StackNotFound, NoCredentials,
    StackError (no AsgName/ServiceName output), botocore ClientError.
    """
    if not deadline_hours or deadline_hours <= 0:
        raise ValueError("start needs a deadline: deadline_hours > 0 (the GPUs must stop without servelab)")
    session = open_session(params, session_factory)
    outs = outputs(params, session_factory=lambda _r: session)
    missing = [k for k in ("AsgName", "ClusterName", "ServiceName") if not outs.get(k)]
    if missing:
        raise StackError(f"stack {params.stack_name} has no {', '.join(missing)} output")
    log = []
    restored = restore_max_size(session.client("autoscaling"), outs["AsgName"])
    if restored:
        log.append(restored)
    when = now_utc() + timedelta(hours=deadline_hours)
    set_deadline(outs["AsgName"], when, region=params.region, session_factory=lambda _r: session, now_utc=now_utc)
    log.append(f"deadline: {outs['AsgName']} scales to 0 at {when.astimezone(UTC).isoformat(timespec='seconds')} "
               f"({deadline_hours:g} h, {DEADLINE_ACTION})")
    session.client("ecs").update_service(cluster=outs["ClusterName"], service=outs["ServiceName"], desiredCount=1)
    log.append(f"ecs:UpdateService {outs['ServiceName']} desiredCount=1 (the capacity provider scales "
               f"{outs['AsgName']} 0 -> 1; watch with servelab aws status)")
    return log


def arm_group(host: Any, region: str, asg: str | None) -> dict[str, Any]:
    """Set the servelab-deadline on `asg` for an EcsServiceHost starting in `region` (deadline at
    its clock + host.limit_hours(region)), after restoring MaxSize when an earlier deadline left it at
    0. Records and returns host.deadline ({"utc", "hours", "why", "region", "asg", "action"}).
    Raises StackError without a group (host.aws.asg_name), botocore ClientError."""
    rec = host.deadline_record(region)
    if not asg:
        raise StackError(f"{region}: no Auto Scaling group found for {host.p.service}: cannot set the "
                         "AWS-enforced deadline (set host.aws.asg_name)")
    restored = restore_max_size(host.client(region, "autoscaling"), asg)
    if restored:
        host.log(f"{region}: {restored}")
    set_deadline(asg, datetime.fromisoformat(rec["utc"]), region=region, session_factory=host.session,
                 now_utc=lambda: datetime.fromtimestamp(host.clock(), UTC))
    host.deadline = {**rec, "region": region, "asg": asg, "action": DEADLINE_ACTION}
    host.log(f"{region}: deadline: {asg} scales to 0 at {rec['utc']} ({rec['hours']:.2f} h, {rec['why']})")
    return host.deadline


def clear_group(host: Any, deadline: dict[str, Any] | None) -> str | None:
    """Remove a deadline `arm_group` set (after a clean stop); returns what was done, None when
    there was none. Raises botocore ClientError."""
    if not deadline or not deadline.get("asg"):
        return None
    clear_deadline(deadline["asg"], region=deadline["region"], session_factory=host.session)
    host.deadline = None
    return f"deadline {deadline.get('action', DEADLINE_ACTION)} on {deadline['asg']} cleared"
