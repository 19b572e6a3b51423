"""One GPU instance from the public ECS GPU AMI (SSM parameter) whose user data runs the
engine container, reached through an SSM port forward; stop = terminate. For a user without
the ECS stack."""

from __future__ import annotations

import shlex
from typing import Any


from ...secrets import SECRET_NAME
from .base import CAPACITY_CODES, CAPACITY_TEXT, TAG_KEY, BotoHost, HostInfo, container_argv, epoch, err_code, guard_line
from .errors import AwsHostError, NotDeployed, RegionCapacity
from .tunnel import port_forward_command

# ==========================================================================================
class SingleInstanceHost(BotoHost):
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
                raise NotDeployed(f"no subnets given for {region} and no default VPC there")
            vpc = vpcs[0]["VpcId"]
            if not subnets:
                subnets = [s["SubnetId"] for s in ec2.describe_subnets(
                    Filters=[{"Name": "vpc-id", "Values": [vpc]}]).get("Subnets", [])]
            if not sgs:
                sgs = [g["GroupId"] for g in ec2.describe_security_groups(
                    Filters=[{"Name": "vpc-id", "Values": [vpc]}, {"Name": "group-name", "Values": ["default"]}]
                ).get("SecurityGroups", [])]
        return list(subnets), list(sgs)

    # -- the boot script's parts (also the study runner's, `remote.InstanceRunnerHost`) ---------------------
    def boot_lines(self, env: dict[str, str], region: str, header: list[str]) -> list[str]:
        """`header`, then the dead-man shutdown at max_hours (or the deadline's hours) and the ECS agent off.
        AwsHostError where an env name looks secret: user data is readable by anyone with
        ec2:DescribeInstanceAttribute."""
        for k in env:
            if SECRET_NAME.search(k):
                raise AwsHostError(f"env {k} looks secret; user data is readable by anyone with "
                                   "ec2:DescribeInstanceAttribute: put it in SSM and use host.aws.secret_parameters")
        lines = list(header)
        hours = (self.limit_hours(region)[0] if self.arm_deadline else None) or self.p.max_hours
        if hours:
            lines.append(f"shutdown -h +{max(int(hours * 60), 1)}  # dead-man switch: shutdown behaviour is terminate")
        return lines + ["systemctl disable --now ecs || true"]

    def secret_exports(self, region: str) -> list[str]:
        """The secret parameters read from SSM on the instance (never written into the user data)."""
        q = shlex.quote
        return [f"export {name}=$(aws ssm get-parameter --region {q(region)} --with-decryption --name {q(param)} "
                "--query Parameter.Value --output text)" for name, param in self.p.secret_parameters.items()]

    def env_words(self, env: dict[str, str]) -> list[str]:
        """`docker run`'s -e words: the engine's env, then the secrets' names (their values come from the shell)."""
        words = []
        for k, v in sorted(env.items()):
            words += ["-e", shlex.quote(f"{k}={v}")]
        for name in self.p.secret_parameters:
            words += ["-e", shlex.quote(name)]
        return words

    def user_data(self, command: list[str], env: dict[str, str], region: str) -> str:
        """Boot script: a dead-man shutdown at max_hours, then `docker run` of the engine."""
        q = shlex.quote
        lines = self.boot_lines(env, region, ["#!/bin/bash",
                                              "# servelab single-instance host: the engine container, no ECS cluster",
                                              "set -euo pipefail"])
        lines += ["mkdir -p /var/lib/llm-model-cache",
                  'TOKEN=$(curl -sX PUT http://169.254.169.254/latest/api/token '
                  '-H "X-aws-ec2-metadata-token-ttl-seconds: 300")',
                  'IID=$(curl -s -H "X-aws-ec2-metadata-token: $TOKEN" '
                  'http://169.254.169.254/latest/meta-data/instance-id)']
        lines += self.secret_exports(region)
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
        run += self.env_words(env)
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
            inst = self._launch(ec2, region, command, env)
        iid = inst["InstanceId"]
        launched = epoch(inst.get("LaunchTime")) or self.clock()
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
                        started_at=self.started_at, hourly_usd=hourly, deadline=self._deadline(region))

    def _launch(self, ec2: Any, region: str, command: list[str], env: dict[str, str]) -> dict[str, Any]:
        """ec2:RunInstances in the first of the region's subnets with capacity (RegionCapacity if none)."""
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
                if err_code(e) in CAPACITY_CODES or CAPACITY_TEXT.search(str(e)):
                    last = f"{err_code(e) or 'capacity'} in {subnet}: {str(e)[:200]}"
                    continue
                raise
        if inst is None:
            raise RegionCapacity(last or "run_instances found no capacity")
        self.log(f"{region}: ec2:RunInstances -> {inst['InstanceId']}")
        return inst

    def _deadline(self, region: str) -> dict[str, Any] | None:
        """The user data's `shutdown -h` (terminate on shutdown): the instance's own deadline."""
        rec = self.deadline_record(region)
        return {**rec, "region": region, "action": "shutdown -h (instance terminates itself)"} if rec else None

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
                t = epoch(i.get("LaunchTime"))
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
        lines.append("aws: " + guard_line(p) + "; every failure path terminates the instance")
        return lines

    def deploy(self, command: list[str], env: dict[str, str] | None = None) -> HostInfo:
        """Another configuration: a fresh instance (user data runs once)."""
        if self.region:
            self._teardown(self.region)
            if self.teardown_errors:
                raise AwsHostError("could not replace the instance" + self._teardown_note())
            self.region, self.started_at = None, None
        return self.start(command, env)
