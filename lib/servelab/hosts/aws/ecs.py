"""The ECS GPU stack through boto3: an ECS service on EC2 GPU instances of an Auto Scaling group
behind a capacity provider, reached through an internal ALB.

start = (register the configuration's task definition) + desired count 1, then wait for an
InService instance, a RUNNING task and a healthy ALB target; status; logs (CloudWatch);
stop = desired 0, wait for the tasks to stop, scale the group to 0 unless another service
uses the same capacity provider, wait for the instances to terminate."""

from __future__ import annotations

import shlex
from datetime import datetime, timezone
from typing import Any

from .base import CAPACITY_TEXT, BotoHost, HostInfo, container_argv, epoch, err_code
from .errors import AwsHostError, GuardTripped, HostTimeout, NotDeployed, RegionCapacity
from .plan import ecs_plan
from .tunnel import port_forward_command

_TD_READONLY = ("taskDefinitionArn", "revision", "status", "requiresAttributes", "compatibilities",
                "registeredAt", "registeredBy", "deregisteredAt")

# ==========================================================================================
class EcsServiceHost(BotoHost):
    """The stack: ECS service on EC2 (ASG behind a capacity provider) and an internal ALB."""

    mode = "ecs-service"

    # -- discovery ---------------------------------------------------------------------------
    def _service(self, region: str) -> dict[str, Any]:
        ecs = self.client(region, "ecs")
        try:
            r = ecs.describe_services(cluster=self.p.cluster, services=[self.p.service])
        except Exception as e:  # noqa: BLE001 - ClusterNotFound and friends: not deployed here
            if err_code(e) in ("ClusterNotFoundException", "ServiceNotFoundException", "InvalidParameterException"):
                raise NotDeployed(f"ECS service {self.p.cluster}/{self.p.service} not found ({err_code(e)})") from None
            raise
        svcs = [s for s in r.get("services", []) if s.get("status") != "INACTIVE"]
        if not svcs:
            raise NotDeployed(f"ECS service {self.p.cluster}/{self.p.service} not found in {region}")
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
            raise NotDeployed(f"Auto Scaling group {asg} not found")
        return groups[0], groups[0].get("Instances", [])

    def _capacity_failures(self, region: str, asg: str | None, since: float) -> list[str]:
        if not asg:
            return []
        acts = self.client(region, "autoscaling").describe_scaling_activities(
            AutoScalingGroupName=asg, MaxRecords=50).get("Activities", [])
        out = []
        for a in acts:
            t = epoch(a.get("StartTime"))
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
            stopped = epoch(t.get("stoppedAt"))
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
        return [t for r in res for i in r.get("Instances", []) if (t := epoch(i.get("LaunchTime"))) is not None]

    def _wait_ready(self, region: str, since: float, td_arn: str | None) -> dict[str, Any]:
        deadline = self.clock() + self.p.start_timeout_s
        while True:
            self.guard()
            st = self.probe(region, since, td_arn)
            launched = self._launch_times(region, [i["InstanceId"] for i in st["instances"]])
            if launched and self.started_at is not None:
                self.started_at = min(self.started_at, min(launched))
            if len(st["capacity_failures"]) >= self.p.max_capacity_failures:
                raise RegionCapacity(st["capacity_failures"][-1])
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
                        started_at=self.started_at, hourly_usd=hourly, deadline=self.deadline)

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
        self._arm_deadline(region, svc)  # before the service asks for an instance
        self.log(f"{region}: ecs:UpdateService {self.p.service} desiredCount=1")
        ecs.update_service(**update)
        st = self._wait_ready(region, now, td_arn)
        return self._info(region, st)

    # -- the deadline AWS enforces (deadline.arm_group / clear_group) --------------------
    def _arm_deadline(self, region: str, svc: dict[str, Any]) -> None:
        """servelab-deadline on the service's Auto Scaling group before it scales out."""
        if self.arm_deadline:
            from .deadline import arm_group  # botocore, like every AWS call (not at import: see session)

            arm_group(self, region, self._asg(region, svc))

    def clear_deadline(self, deadline: dict[str, Any] | None) -> str | None:
        from .deadline import clear_group  # botocore, as in _arm_deadline

        return clear_group(self, deadline)

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
        except NotDeployed as e:
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
            except NotDeployed as e:
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
            raise AwsHostError("no log group: the container has no awslogs configuration; set host.aws.log_group")
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
            if err_code(e) == "ResourceNotFoundException" and "logStreamNames" in kw:
                kw.pop("logStreamNames")
                events = logs.filter_log_events(**kw).get("events", [])
            else:
                raise
        return [f"{datetime.fromtimestamp(e['timestamp'] / 1000, timezone.utc).isoformat(timespec='seconds')} "
                f"{e['message'].rstrip()}" for e in sorted(events, key=lambda e: e["timestamp"])][-limit:]

    def tunnel_command(self, region: str | None = None) -> list[str] | None:
        r = region or self.region or self.p.regions[0]
        return self._endpoint(r, self.probe(r))[1]

    # -- dry run (plan.ecs_plan) -------------------------------------------------------
    def plan(self, commands: dict[str, list[str]] | None = None) -> list[str]:
        return ecs_plan(self.p, commands)
