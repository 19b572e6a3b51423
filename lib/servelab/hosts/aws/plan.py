"""What `servelab run --dry-run` says about an AWS host, without calling AWS: the stack to
create (its template resources and hourly cost from stack.plan), the ECS calls per
configuration, the AWS-enforced deadline, the stop, the limits. Below `ecs` (whose
`EcsServiceHost.plan` is the entry point) and `host` (the stack and deadline lines)."""

from __future__ import annotations

from typing import Any

from ...schema import AwsParams
from .base import container_argv, guard_line
from .errors import StackError
from .session import StackParams


def ecs_plan(p: AwsParams, commands: dict[str, list[str]] | None = None) -> list[str]:
    """The ECS service host's calls, in order, for these configurations' commands."""
    stack = f"stack {p.stack.name}'s " if p.stack else ""
    cluster = p.cluster or f"<{stack}ClusterName>"
    service = p.service or f"<{stack}ServiceName>"
    regions = [p.stack_region] if p.stack else p.regions
    lines = [
        f"aws: ecs-service {cluster}/{service}, {p.instance_type}; regions in order {', '.join(regions)} "
        + ("(the stack's region)" if p.stack else
           "(next region on InsufficientInstanceCapacity / unsupported / vCPU limit)"),
        "aws: guard: sts:GetCallerIdentity must be "
        + (p.expected_account_id or f"${p.expected_account_id_env}") + " before any call that changes anything",
    ]
    cp = p.capacity_provider or (f"<{stack}CapacityProviderName>" if p.stack else "the service's capacity provider")
    asg = p.asg_name or (f"<{stack}AsgName>" if p.stack else "its Auto Scaling group")
    container = p.container_name or ("engine" if p.stack else "<first>")
    on_capacity = "stop here (a stack has one region)" if p.stack else "stop here, next region"
    for i, (cid, cmd) in enumerate((commands or {"<configuration>": []}).items()):
        if p.update_task_definition and cmd:
            entry, args = container_argv(cmd)
            lines.append(f"aws: [{cid}] ecs:RegisterTaskDefinition (service's family; container "
                         f"{container}: entryPoint {' '.join(entry)}, {len(args)} args"
                         + (f", image {p.image}" if p.image else "") + ")")
        if i == 0:
            lines.append(f"aws: [{cid}] ecs:UpdateService {service} desiredCount=1 -> {cp} scales {asg} 0->1 "
                         f"({p.instance_type})")
            lines.append(f"aws: [{cid}] wait (poll {p.poll_s:g} s, {p.start_timeout_s:g} s): instance InService, "
                         f"task RUNNING, ALB target healthy; a failed launch for capacity -> {on_capacity}")
        else:
            lines.append(f"aws: [{cid}] ecs:UpdateService taskDefinition=<new> (minimumHealthyPercent 0: old task "
                         "stops first on the same instance); wait task RUNNING + target healthy")
    lines.append(f"aws: tunnel: aws ssm start-session --target <instance> --document-name "
                 f"AWS-StartPortForwardingSessionToRemoteHost --parameters host=<internal ALB DNS>,portNumber=80,"
                 f"localPortNumber={p.local_port}")
    lines.append(f"aws: stop: ecs:UpdateService desiredCount=0; wait tasks STOPPED; unless another service uses "
                 f"{cp}: remove scale-in protection, autoscaling:UpdateAutoScalingGroup {asg} DesiredCapacity=0; "
                 f"wait instances terminated ({p.stop_timeout_s:g} s)")
    lines.append("aws: " + guard_line(p) + "; every failure path runs the stop above")
    return lines


def deadline_hours(p: AwsParams, hourly_usd: float | None) -> tuple[float | None, str]:
    """(hours, how) of the AWS-enforced deadline: max_hours, or what max_spend_usd buys at
    `hourly_usd`, the earlier; (None, why not) when neither is known."""
    options = []
    if p.max_hours:
        options.append((p.max_hours, f"max_hours {p.max_hours:g}"))
    if p.max_spend_usd and hourly_usd:
        options.append((p.max_spend_usd / hourly_usd,
                        f"max_spend_usd {p.max_spend_usd:g} at {hourly_usd:g} USD/h = {p.max_spend_usd / hourly_usd:.1f} h"))
    if not options:
        return None, "max_spend_usd without a price"
    hours, _ = min(options)
    return hours, "; ".join(how for _, how in options) + ("; the earlier" if len(options) > 1 else "")


def deadline_line(p: AwsParams, kind: str, hourly_usd: float | None) -> str:
    """The dry run's line about the deadline AWS enforces itself (servelab dead or alive)."""
    hours, how = deadline_hours(p, hourly_usd)
    at = f"start + {hours:.2f} h ({how})" if hours is not None else f"? ({how})"
    if kind == "aws-instance":
        return (f"aws: deadline: the instance's user data runs `shutdown -h` at {at}; shutdown behaviour "
                "terminate: the instance ends itself even if servelab dies")
    return ("aws: deadline: before the service scales out, autoscaling:PutScheduledUpdateGroupAction "
            f"servelab-deadline on the group (min/max/desired 0) at {at}, tag servelab:deadline; AWS stops the "
            "GPU even if servelab dies mid-benchmark; recorded in host.json and run.json; cleared after a clean "
            "stop, kept on every failure path")


def stack_lines(p: AwsParams, instance_hourly_usd: float | None) -> list[str]:
    """The stack to create: template resources and USD per hour idle and running (no AWS call)."""
    if p.stack is None:
        return []
    from .stack import plan as stack_plan  # botocore (its module's other functions call AWS)

    s = p.stack
    region = p.stack_region or p.regions[0]
    params = {k: v for k, v in s.parameters.items()}
    params.setdefault("InstanceType", p.instance_type)
    sp = StackParams(s.name, region, params, p.profile)
    given = " ".join(f"{k}={','.join(map(str, v)) if isinstance(v, list) else v}" for k, v in params.items())
    what = "create or update" if s.create else "use (must exist)"
    try:
        pl = stack_plan(sp, instance_hourly_usd=instance_hourly_usd)
    except (StackError, KeyError) as e:
        return [f"aws: stack {s.name} in {region}: {what}; cannot price it: {str(e).strip(chr(34))}"]
    lines = [f"aws: stack {s.name} in {region}: {what} from templates/ecs-gpu-stack.yaml (CloudFormation, "
             f"{len(pl.resources)} resources); parameters {given}"]
    lines += [f"aws: stack resource {lid} {rtype}" for lid, rtype in pl.resources]

    def items(xs: list[Any]) -> str:
        return " + ".join(f"{i.name} {i.usd:.4f}" for i in xs)
    lines.append(f"aws: stack hourly idle (service 0): {pl.idle_hourly_usd:.4f} USD/h ({items(pl.idle_items)})")
    lines.append(f"aws: stack hourly running (1 x {params['InstanceType']}): {pl.running_hourly_usd:.4f} USD/h "
                 f"({items(pl.running_items)})")
    lines.append(f"aws: the stack stays after the run (idle {pl.idle_hourly_usd:.4f} USD/h): "
                 f"servelab aws down --stack {s.name} --region {region} removes it; fixed prices "
                 "data/aws-fixed-prices.yaml (status quoted)")
    return lines
