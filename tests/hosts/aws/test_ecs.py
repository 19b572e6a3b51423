"""AWS hosts against moto: the seeds' ECS stack (VPC, ASG + launch template behind a capacity
provider, ECS service, internal ALB + target group, CloudWatch logs) and the single-instance
path. Start / status / stop are idempotent; a failed start ends stopped; capacity errors move
to the next region; the spend and account guards stop or refuse.

moto does not run ECS's scheduler or the capacity provider (updating desiredCount only sets
counters, no instance or task appears), it cannot start awsvpc tasks (run_task fails building
the ENI attachment), it returns no Auto Scaling activities and it does not keep a service's
capacity provider strategy. `Cloud` below plays those parts, one step per injected sleep:
scale the group when the service wants a task, register the container instance, run the
service's task (bridge networking, instance targets), register the target, stop tasks when
the service goes to 0; and it injects capacity failures (a failed scaling activity, an
InsufficientInstanceCapacity error from RunInstances) through botocore before-call hooks.
"""

from __future__ import annotations

import base64
import json
import time
from datetime import datetime, timezone
from functools import partial
from types import SimpleNamespace

import boto3
import pytest
from moto import mock_aws

from servelab.hosts.aws.base import container_argv
from servelab.hosts.aws.ecs import EcsServiceHost
from servelab.hosts.aws.errors import AccountMismatch, AwsHostError, CapacityUnavailable, GuardTripped, HostTimeout
from servelab.hosts.aws.instance import SingleInstanceHost
from servelab.hosts.aws.tunnel import port_forward_command
from servelab.hosts import for_study
from servelab.schema import GPU_AMI_PARAMETER, AwsEcsHostParams, AwsInstanceHostParams, AwsParams, resolve_profile
from paths import ROOT

ACCOUNT = "123456789012"  # moto's
CLUSTER, SERVICE, POOL, CP = "llm", "llm-deepseek-v4-flash", "g7e-2gpu", "g7e-2gpu-cp"
COMMAND_A = ["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "nvidia/DeepSeek-V4-Flash-NVFP4",
             "--host", "0.0.0.0", "--port", "8000", "--tensor-parallel-size", "2", "--enforce-eager"]
COMMAND_B = COMMAND_A[:-1] + ["--compilation-config", '{"mode":0,"cudagraph_mode":"FULL_DECODE_ONLY"}']


@pytest.fixture
def aws(monkeypatch):
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_SESSION_TOKEN": "testing",
                 "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.setenv("SERVELAB_AWS_ACCOUNT_ID", ACCOUNT)
    from moto.moto_api import state_manager

    # moto walks a task from RUNNING to STOPPED on every describe; a served engine stays up
    state_manager.set_transition(model_name="ecs::task", transition={"progression": "manual", "times": 10**9})
    try:
        with mock_aws():
            yield
    finally:
        state_manager.unset_transition(model_name="ecs::task")


def build_stack(region: str, *, protect: bool = False, other_service: bool = False) -> dict:
    """The seeds' Terraform stack in one region, as moto can hold it."""
    ec2, auto = boto3.client("ec2", region_name=region), boto3.client("autoscaling", region_name=region)
    ecs, elb = boto3.client("ecs", region_name=region), boto3.client("elbv2", region_name=region)
    logs = boto3.client("logs", region_name=region)
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    azs = [z["ZoneName"] for z in ec2.describe_availability_zones()["AvailabilityZones"]][:2]
    subnets = [ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.0.{i}.0/24", AvailabilityZone=az)["Subnet"]["SubnetId"]
               for i, az in enumerate(azs)]
    sg = ec2.create_security_group(GroupName="llm", Description="ALB to task", VpcId=vpc)["GroupId"]
    image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    ec2.create_launch_template(LaunchTemplateName="llm-gpu", LaunchTemplateData={
        "ImageId": image, "InstanceType": "g7e.12xlarge",
        "BlockDeviceMappings": [{"DeviceName": "/dev/xvda", "Ebs": {"VolumeSize": 500, "VolumeType": "gp3"}}],
        "MetadataOptions": {"HttpTokens": "required", "HttpPutResponseHopLimit": 2}})
    auto.create_auto_scaling_group(AutoScalingGroupName=POOL, LaunchTemplate={"LaunchTemplateName": "llm-gpu",
                                                                               "Version": "$Latest"},
                                   MinSize=0, MaxSize=1, DesiredCapacity=0, VPCZoneIdentifier=",".join(subnets),
                                   NewInstancesProtectedFromScaleIn=protect)
    asg_arn = auto.describe_auto_scaling_groups(AutoScalingGroupNames=[POOL])["AutoScalingGroups"][0][
        "AutoScalingGroupARN"]
    ecs.create_cluster(clusterName=CLUSTER)
    ecs.create_capacity_provider(name=CP, autoScalingGroupProvider={
        "autoScalingGroupArn": asg_arn, "managedScaling": {"status": "ENABLED", "targetCapacity": 100},
        "managedTerminationProtection": "ENABLED" if protect else "DISABLED"})
    ecs.put_cluster_capacity_providers(cluster=CLUSTER, capacityProviders=[CP],
                                       defaultCapacityProviderStrategy=[{"capacityProvider": CP, "weight": 1}])
    td = ecs.register_task_definition(family="llm-vllm", networkMode="bridge", containerDefinitions=[{
        "name": "vllm", "image": "vllm/vllm-openai:v0.26.0", "memory": 1024, "essential": True,  # moto places by memory; the real one asks ~180 GB
        "portMappings": [{"containerPort": 8000, "hostPort": 8000}],
        "environment": [{"name": "HF_HOME", "value": "/cache"}],
        "mountPoints": [{"sourceVolume": "model-cache", "containerPath": "/cache"}],
        "resourceRequirements": [{"type": "GPU", "value": "2"}],
        "logConfiguration": {"logDriver": "awslogs", "options": {
            "awslogs-group": "/ecs/llm", "awslogs-region": region, "awslogs-stream-prefix": "ecs"}}}],
        volumes=[{"name": "model-cache", "host": {"sourcePath": "/var/lib/llm-model-cache"}}])["taskDefinition"]
    lb = elb.create_load_balancer(Name="llm-internal", Subnets=subnets, SecurityGroups=[sg], Scheme="internal",
                                  Type="application")["LoadBalancers"][0]
    tg = elb.create_target_group(Name="llm-tg", Protocol="HTTP", Port=8000, VpcId=vpc, TargetType="instance",
                                 HealthCheckPath="/health")["TargetGroups"][0]["TargetGroupArn"]
    elb.create_listener(LoadBalancerArn=lb["LoadBalancerArn"], Protocol="HTTP", Port=80,
                        DefaultActions=[{"Type": "forward", "TargetGroupArn": tg}])
    ecs.create_service(cluster=CLUSTER, serviceName=SERVICE, taskDefinition=td["taskDefinitionArn"], desiredCount=0,
                       capacityProviderStrategy=[{"capacityProvider": CP, "weight": 1}],
                       loadBalancers=[{"targetGroupArn": tg, "containerName": "vllm", "containerPort": 8000}])
    if other_service:
        ecs.create_service(cluster=CLUSTER, serviceName="llm-nemotron-nano", taskDefinition=td["taskDefinitionArn"],
                           desiredCount=1, capacityProviderStrategy=[{"capacityProvider": CP, "weight": 1}])
    logs.create_log_group(logGroupName="/ecs/llm")
    return {"tg": tg, "dns": lb["DNSName"], "td": td["taskDefinitionArn"], "image": image}


class Cloud:
    """ECS scheduler + capacity provider, played on moto one step per injected sleep."""

    def __init__(self, regions: list[str], *, no_capacity: tuple[str, ...] = (), never_healthy: bool = False):
        self.regions, self.no_capacity, self.never_healthy = regions, set(no_capacity), never_healthy
        self.now = time.time()
        self.sleeps = 0
        self.activities: dict[str, list[dict]] = {}
        self.run_instances_calls: dict[str, int] = {}
        self._clients: dict[tuple[str, str], object] = {}

    # injected into the host
    def clock(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s
        self.sleeps += 1
        if self.sleeps > 500:
            raise AssertionError("the host never stopped waiting")
        for r in self.regions:
            self.step(r)

    def factory(self, region: str):
        sess = boto3.Session(region_name=region)
        sess.events.register("before-call.auto-scaling.DescribeScalingActivities", partial(self._activities, region))
        sess.events.register("before-call.ec2.RunInstances", partial(self._run_instances, region))
        return sess

    def _activities(self, region, **kw):
        return SimpleNamespace(status_code=200, headers={}), {"Activities": list(self.activities.get(region, []))}

    def _run_instances(self, region, **kw):
        self.run_instances_calls[region] = self.run_instances_calls.get(region, 0) + 1
        if region in self.no_capacity:
            return SimpleNamespace(status_code=500, headers={}), {"Error": {
                "Code": "InsufficientInstanceCapacity",
                "Message": "We currently do not have sufficient g7e.12xlarge capacity in the Availability Zone you "
                           "requested. Our system will be working on provisioning additional capacity."}}
        return None

    def c(self, region: str, service: str):
        key = (region, service)
        if key not in self._clients:
            self._clients[key] = boto3.client(service, region_name=region)
        return self._clients[key]

    # one step of the control plane
    def step(self, region: str) -> None:
        ecs, auto, elb = self.c(region, "ecs"), self.c(region, "autoscaling"), self.c(region, "elbv2")
        try:
            svc = ecs.describe_services(cluster=CLUSTER, services=[SERVICE])["services"][0]
        except Exception:  # noqa: BLE001 - no stack in this region
            return
        group = auto.describe_auto_scaling_groups(AutoScalingGroupNames=[POOL])["AutoScalingGroups"][0]
        tasks = self.service_tasks(region)
        tg = svc["loadBalancers"][0]["targetGroupArn"]
        if svc["desiredCount"] == 0:
            for t in tasks:
                ecs.stop_task(cluster=CLUSTER, task=t["taskArn"], reason="Scaling activity initiated by deployment")
            targets = [h["Target"] for h in elb.describe_target_health(TargetGroupArn=tg)["TargetHealthDescriptions"]
                       if h["TargetHealth"]["State"] == "healthy"]
            if targets:
                elb.deregister_targets(TargetGroupArn=tg, Targets=targets)
            return
        if region in self.no_capacity:
            if not self.activities.get(region):
                self.activities[region] = [{
                    "ActivityId": "a1", "AutoScalingGroupName": POOL, "StatusCode": "Failed", "Progress": 100,
                    "Cause": "capacity provider scaled the group from 0 to 1",
                    "Description": "Launching a new EC2 instance.  Status Reason: Could not launch On-Demand "
                                   "Instances. InsufficientInstanceCapacity",
                    "StatusMessage": "We currently do not have sufficient g7e.12xlarge capacity in the Availability "
                                     "Zone you requested (eu-west-2a). Launching EC2 instance failed.",
                    "StartTime": datetime.fromtimestamp(self.now, timezone.utc)}]
            return
        if group["DesiredCapacity"] == 0:
            auto.set_desired_capacity(AutoScalingGroupName=POOL, DesiredCapacity=1)
            return
        inst = [i for i in group["Instances"] if i["LifecycleState"] == "InService"]
        if not inst:
            return
        iid = inst[0]["InstanceId"]
        ci_arns = ecs.list_container_instances(cluster=CLUSTER)["containerInstanceArns"]
        cis = ecs.describe_container_instances(cluster=CLUSTER, containerInstances=ci_arns)[
            "containerInstances"] if ci_arns else []
        if not any(c.get("ec2InstanceId") == iid for c in cis):
            ecs.register_container_instance(cluster=CLUSTER, instanceIdentityDocument=json.dumps(
                {"instanceId": iid, "region": region}))
            return
        current = [t for t in tasks if t["taskDefinitionArn"] == svc["taskDefinition"]]
        if not current:
            for t in tasks:  # minimumHealthyPercent 0: the old task goes first
                ecs.stop_task(cluster=CLUSTER, task=t["taskArn"], reason="deployment")
            ecs.run_task(cluster=CLUSTER, taskDefinition=svc["taskDefinition"], count=1, launchType="EC2",
                         group=f"service:{SERVICE}", startedBy="ecs-svc/0123456789")
            return
        registered = {h["Target"]["Id"] for h in elb.describe_target_health(TargetGroupArn=tg)["TargetHealthDescriptions"]
                      if h["TargetHealth"]["State"] == "healthy"}
        if iid not in registered and not self.never_healthy:
            elb.register_targets(TargetGroupArn=tg, Targets=[{"Id": iid, "Port": 8000}])

    def service_tasks(self, region: str) -> list[dict]:
        ecs = self.c(region, "ecs")
        arns = ecs.list_tasks(cluster=CLUSTER, desiredStatus="RUNNING")["taskArns"]
        if not arns:
            return []
        return [t for t in ecs.describe_tasks(cluster=CLUSTER, tasks=arns)["tasks"] if t.get("group") == f"service:{SERVICE}"]


def params(regions: list[str], **kw) -> AwsParams:
    base = dict(regions=regions, instance_type="g7e.12xlarge", cluster=CLUSTER, service=SERVICE,
                container_name="vllm", max_hours=8, hourly_usd=8.2861, poll_s=15, start_timeout_s=1800,
                stop_timeout_s=600)
    return AwsParams(**{**base, **kw})


def host_for(cloud: Cloud, **kw) -> EcsServiceHost:
    log: list[str] = []
    h = EcsServiceHost(params(cloud.regions, **kw), cloud.factory, sleep=cloud.sleep, clock=cloud.clock,
                       log=log.append)
    h.messages = log  # type: ignore[attr-defined]
    return h


def state(region: str) -> dict:
    ecs, auto = boto3.client("ecs", region_name=region), boto3.client("autoscaling", region_name=region)
    ec2 = boto3.client("ec2", region_name=region)
    svc = ecs.describe_services(cluster=CLUSTER, services=[SERVICE])["services"][0]
    group = auto.describe_auto_scaling_groups(AutoScalingGroupNames=[POOL])["AutoScalingGroups"][0]
    res = ec2.describe_instances(Filters=[{"Name": "instance-state-name", "Values": ["pending", "running"]}])
    return {"desired": svc["desiredCount"], "asg": group["DesiredCapacity"], "asg_instances": len(group["Instances"]),
            "live_instances": sum(len(r["Instances"]) for r in res["Reservations"]), "td": svc["taskDefinition"]}


STOPPED = {"desired": 0, "asg": 0, "asg_instances": 0, "live_instances": 0}


def stopped(region: str) -> bool:
    s = state(region)
    return {k: s[k] for k in STOPPED} == STOPPED


# -- ECS service -------------------------------------------------------------------------------
def test_start_status_logs_stop_are_idempotent(aws):
    stack = build_stack("eu-west-2")
    cloud = Cloud(["eu-west-2"])
    host = host_for(cloud)
    info = host.start(COMMAND_A, {"VLLM_LOGGING_LEVEL": "INFO"})
    assert info.region == "eu-west-2" and len(info.instance_ids) == 1 and len(info.task_arns) == 1
    assert info.url == f"http://{stack['dns']}"
    assert info.tunnel == port_forward_command("eu-west-2", info.instance_ids[0], 80, 8000, host=stack["dns"])
    assert info.tunnel[info.tunnel.index("--document-name") + 1] == "AWS-StartPortForwardingSessionToRemoteHost"
    assert json.loads(info.tunnel[-1]) == {"host": [stack["dns"]], "portNumber": ["80"], "localPortNumber": ["8000"]}
    s = state("eu-west-2")
    assert (s["desired"], s["asg"], s["live_instances"]) == (1, 1, 1)
    # the configuration's command went into a new task definition revision, the rest was kept
    td = boto3.client("ecs", region_name="eu-west-2").describe_task_definition(taskDefinition=s["td"])["taskDefinition"]
    c = td["containerDefinitions"][0]
    assert td["revision"] == 2 and (c["entryPoint"], c["command"]) == container_argv(COMMAND_A)
    assert {e["name"]: e["value"] for e in c["environment"]} == {"HF_HOME": "/cache", "VLLM_LOGGING_LEVEL": "INFO"}
    assert c["mountPoints"] == [{"sourceVolume": "model-cache", "containerPath": "/cache"}]
    # start again: same host, no new revision
    again = host.start(COMMAND_A, {"VLLM_LOGGING_LEVEL": "INFO"})
    assert again.instance_ids == info.instance_ids and state("eu-west-2")["td"] == s["td"]
    st = host.status()["eu-west-2"]
    assert st["ready"] and st["service"]["desiredCount"] == 1 and st["asg_desired"] == 1
    assert [t["state"] for t in st["targets"]] == ["healthy"] and [t["last"] for t in st["tasks"]] == ["RUNNING"]
    assert st["hourly_usd"] == 8.2861 and st["spend_usd"] >= 0 and st["url"] == info.url
    # logs: the awslogs stream of the running task
    task_id = info.task_arns[0].split("/")[-1]
    logs = boto3.client("logs", region_name="eu-west-2")
    logs.create_log_stream(logGroupName="/ecs/llm", logStreamName=f"ecs/vllm/{task_id}")
    logs.put_log_events(logGroupName="/ecs/llm", logStreamName=f"ecs/vllm/{task_id}", logEvents=[
        {"timestamp": int(cloud.now * 1000) - 2000, "message": "INFO: Started server process"},
        {"timestamp": int(cloud.now * 1000) - 1000, "message": "INFO: Application startup complete."}])
    lines = host.logs()
    assert [ln.split(" ", 1)[1] for ln in lines] == ["INFO: Started server process", "INFO: Application startup complete."]
    # stop, twice
    first = host.stop()["eu-west-2"]
    assert "ecs:UpdateService llm-deepseek-v4-flash desiredCount=0" in first
    assert f"autoscaling:UpdateAutoScalingGroup {POOL} DesiredCapacity=0" in first
    assert stopped("eu-west-2")
    second = host.stop("eu-west-2")["eu-west-2"]
    assert not any("Update" in a for a in second)
    assert stopped("eu-west-2")


def test_deploy_switches_configuration_on_the_same_instance(aws):
    build_stack("eu-west-2")
    cloud = Cloud(["eu-west-2"])
    host = host_for(cloud)
    a = host.start(COMMAND_A)
    b = host.deploy(COMMAND_B)
    assert b.instance_ids == a.instance_ids and b.task_arns != a.task_arns
    td = state("eu-west-2")["td"]
    cmd = boto3.client("ecs", region_name="eu-west-2").describe_task_definition(taskDefinition=td)[
        "taskDefinition"]["containerDefinitions"][0]["command"]
    assert cmd == container_argv(COMMAND_B)[1]
    assert [t["taskDefinitionArn"] for t in cloud.service_tasks("eu-west-2")] == [td]  # the old task is gone
    host.stop()
    assert stopped("eu-west-2")


def test_stop_after_a_failed_start(aws):
    build_stack("eu-west-2")
    cloud = Cloud(["eu-west-2"], never_healthy=True)  # the engine never passes the ALB health check
    host = host_for(cloud, start_timeout_s=300)
    with pytest.raises(HostTimeout, match="not ready after 300 s"):
        host.start(COMMAND_A)
    assert stopped("eu-west-2")  # torn down: desired 0, group 0, instance terminated
    assert host.region is None
    assert not any("Update" in a for a in host.stop()["eu-west-2"])  # nothing left to do


def test_start_interrupted_is_torn_down(aws):
    build_stack("eu-west-2")
    cloud = Cloud(["eu-west-2"], never_healthy=True)
    host = host_for(cloud)
    real = cloud.sleep

    def interrupt(s):
        real(s)
        if cloud.sleeps == 4:
            raise KeyboardInterrupt

    host.sleep = interrupt
    with pytest.raises(KeyboardInterrupt):
        host.start(COMMAND_A)
    host.sleep = real
    assert stopped("eu-west-2")


def test_region_fallback_on_capacity(aws):
    for r in ("ap-northeast-1", "us-east-1", "eu-west-2"):
        build_stack(r)
    cloud = Cloud(["ap-northeast-1", "us-east-1", "eu-west-2"], no_capacity=("ap-northeast-1", "us-east-1"))
    host = host_for(cloud)
    info = host.start(COMMAND_A)
    assert info.region == "eu-west-2"
    assert [r for r, _ in info.attempts] == ["ap-northeast-1", "us-east-1"]
    assert all("do not have sufficient g7e.12xlarge capacity" in why for _, why in info.attempts)
    for r in ("ap-northeast-1", "us-east-1"):
        assert stopped(r)  # the failed regions were set back to 0
    assert state("eu-west-2")["desired"] == 1
    host.stop()
    assert stopped("eu-west-2")


def test_no_capacity_anywhere_and_regions_without_the_stack(aws):
    build_stack("ap-northeast-1")
    build_stack("eu-west-2")
    cloud = Cloud(["us-west-2", "ap-northeast-1", "eu-west-2"], no_capacity=("ap-northeast-1", "eu-west-2"))
    host = host_for(cloud)
    with pytest.raises(CapacityUnavailable) as e:
        host.start(COMMAND_A)
    reasons = dict(e.value.attempts)
    assert list(reasons) == ["us-west-2", "ap-northeast-1", "eu-west-2"]
    assert "not found" in reasons["us-west-2"] and "sufficient" in reasons["eu-west-2"]
    assert stopped("ap-northeast-1") and stopped("eu-west-2")


def test_spend_guard_stops_a_start_that_runs_too_long(aws):
    build_stack("eu-west-2")
    cloud = Cloud(["eu-west-2"], never_healthy=True)
    host = host_for(cloud, max_hours=None, max_spend_usd=5.0, hourly_usd=10.0, poll_s=600, start_timeout_s=36000)
    with pytest.raises(GuardTripped, match=r"max_spend_usd 5: host in eu-west-2 stopped"):
        host.start(COMMAND_A)
    assert 1800 <= cloud.sleeps * 600 <= 2400  # 0.5 h at 10 USD/h
    assert stopped("eu-west-2")


def test_time_guard_after_start_and_watchdog(aws):
    build_stack("eu-west-2")
    cloud = Cloud(["eu-west-2"])
    host = host_for(cloud, max_hours=2)
    host.start(COMMAND_A)
    assert host.guard()["hours"] < 2
    cloud.now += 2 * 3600
    with pytest.raises(GuardTripped, match="max_hours 2"):
        host.guard()
    assert stopped("eu-west-2") and host.tripped
    # the watchdog thread does the same while a benchmark runs
    # (moto stamps LaunchTime with the real clock, which the fake clock is now 2 h ahead of:
    # the guard counts from the instance's launch, so give the second host room for that)
    host2 = host_for(cloud, max_hours=5)
    host2.start(COMMAND_A)
    assert host2.guard()["hours"] < 5
    cloud.now += 5 * 3600
    with host2.watchdog(interval_s=0.01) as w:
        deadline = time.monotonic() + 10
        while w.error is None and time.monotonic() < deadline:
            time.sleep(0.02)
    assert isinstance(w.error, GuardTripped) and stopped("eu-west-2")


def test_account_guard_refuses_before_touching_anything(aws, monkeypatch):
    build_stack("eu-west-2")
    cloud = Cloud(["eu-west-2"])
    monkeypatch.setenv("SERVELAB_AWS_ACCOUNT_ID", "111111111111")
    host = host_for(cloud)
    with pytest.raises(AccountMismatch, match="account 123456789012, expected 111111111111"):
        host.start(COMMAND_A)
    with pytest.raises(AccountMismatch):
        host.stop()
    s = state("eu-west-2")
    assert s["desired"] == 0 and s["td"].endswith(":1")  # no task definition registered, nothing scaled
    monkeypatch.delenv("SERVELAB_AWS_ACCOUNT_ID")
    with pytest.raises(AccountMismatch, match="no expected AWS account id"):
        host_for(cloud).start(COMMAND_A)
    ok = host_for(cloud, expected_account_id=ACCOUNT)  # explicit id wins over the variable
    assert ok.check_account() == ACCOUNT


def test_group_kept_while_another_service_uses_it(aws):
    build_stack("eu-west-2", other_service=True)
    cloud = Cloud(["eu-west-2"])
    host = host_for(cloud)
    host.start(COMMAND_A)
    done = host.stop()["eu-west-2"]
    assert any("kept" in d and "llm-nemotron-nano" in d for d in done)
    s = state("eu-west-2")
    assert s["desired"] == 0 and s["asg"] == 1  # the other service still needs the instance
    boto3.client("ecs", region_name="eu-west-2").update_service(cluster=CLUSTER, service="llm-nemotron-nano",
                                                                desiredCount=0)
    host.stop("eu-west-2")
    assert stopped("eu-west-2")


def test_scale_in_protection_is_removed_before_scaling_to_zero(aws):
    build_stack("eu-west-2", protect=True)
    cloud = Cloud(["eu-west-2"])
    host = host_for(cloud)
    info = host.start(COMMAND_A)
    auto = boto3.client("autoscaling", region_name="eu-west-2")
    assert auto.describe_auto_scaling_groups(AutoScalingGroupNames=[POOL])["AutoScalingGroups"][0]["Instances"][0][
        "ProtectedFromScaleIn"]
    done = host.stop()["eu-west-2"]
    assert f"scale-in protection removed from {info.instance_ids}" in done
    assert stopped("eu-west-2")


def test_secrets_never_go_into_a_task_definition():
    with pytest.raises(AwsHostError, match="--api-key with a value"):
        container_argv(COMMAND_A + ["--api-key", "sk-123"])
    assert container_argv(COMMAND_A + ["--api-key", "$SERVELAB_KEY"])[0] == COMMAND_A[:3]


def test_params_need_a_limit_and_the_stack_names():
    with pytest.raises(ValueError, match="max_hours or max_spend_usd"):
        AwsParams(regions=["eu-west-2"], instance_type="g7e.12xlarge", cluster="c", service="s")
    with pytest.raises(ValueError, match="needs host.aws.cluster and host.aws.service"):
        AwsEcsHostParams(kind="aws-ecs", aws=AwsParams(regions=["eu-west-2"], instance_type="g7e.12xlarge", max_hours=1))
    with pytest.raises(ValueError, match="needs host.aws.image"):
        AwsInstanceHostParams(kind="aws-instance", aws=AwsParams(regions=["eu-west-2"], instance_type="g7e.2xlarge", max_hours=1))


# -- single instance ---------------------------------------------------------------------------
def si_params(regions, **kw) -> AwsParams:
    base = dict(regions=regions, instance_type="g7e.2xlarge", image="vllm/vllm-openai:v0.26.0",
                max_hours=3, hourly_usd=3.3631, poll_s=5, name="seed001", ami_parameter="/servelab/test/gpu-ami")
    return AwsParams(**{**base, **kw})


def test_single_instance_start_status_stop_with_fallback(aws):
    regions = ["ap-northeast-1", "eu-west-2"]
    for r in regions:  # the AMI id lives in an SSM parameter, as the public ECS GPU one does
        boto3.client("ssm", region_name=r).put_parameter(Name="/servelab/test/gpu-ami", Value=f"ami-0{r[:2]}1234567890",
                                                         Type="String")
    cloud = Cloud(regions, no_capacity=("ap-northeast-1",))
    host = SingleInstanceHost(si_params(regions), cloud.factory, sleep=cloud.sleep, clock=cloud.clock)
    info = host.start(COMMAND_A, {"VLLM_LOGGING_LEVEL": "INFO"})
    assert info.region == "eu-west-2" and info.attempts[0][0] == "ap-northeast-1"
    assert cloud.run_instances_calls["ap-northeast-1"] >= 1  # tried every subnet there
    iid = info.instance_ids[0]
    assert info.url == "http://127.0.0.1:8000"
    assert info.tunnel == ["aws", "ssm", "start-session", "--region", "eu-west-2", "--target", iid,
                           "--document-name", "AWS-StartPortForwardingSession", "--parameters",
                           '{"portNumber":["8000"],"localPortNumber":["8000"]}']
    ec2 = boto3.client("ec2", region_name="eu-west-2")
    inst = ec2.describe_instances(InstanceIds=[iid])["Reservations"][0]["Instances"][0]
    assert inst["ImageId"] == "ami-0eu1234567890" and inst["InstanceType"] == "g7e.2xlarge"
    assert {t["Key"]: t["Value"] for t in inst["Tags"]}["servelab:host"] == "seed001"
    assert ec2.describe_instance_attribute(InstanceId=iid, Attribute="instanceInitiatedShutdownBehavior")[
        "InstanceInitiatedShutdownBehavior"]["Value"] == "terminate"
    ud = base64.b64decode(ec2.describe_instance_attribute(InstanceId=iid, Attribute="userData")["UserData"]["Value"]).decode()
    assert "shutdown -h +180" in ud  # the instance ends itself after max_hours even if servelab is gone
    assert ("docker run -d --name servelab-engine --restart no --gpus all --ipc=host --ulimit memlock=-1:-1 "
            "-p 8000:8000 -v /var/lib/llm-model-cache:/root/.cache/huggingface -e VLLM_LOGGING_LEVEL=INFO "
            "--entrypoint python3 vllm/vllm-openai:v0.26.0 -m vllm.entrypoints.openai.api_server --model "
            "nvidia/DeepSeek-V4-Flash-NVFP4") in ud
    # idempotent start: the tagged instance is reused
    assert host.start(COMMAND_A, {"VLLM_LOGGING_LEVEL": "INFO"}).instance_ids == [iid]
    st = host.status("eu-west-2")["eu-west-2"]["instances"]
    assert [(i["id"], i["state"]) for i in st] == [(iid, "running")]
    assert host.stop()["eu-west-2"] == [f"ec2:TerminateInstances ['{iid}']", "terminated"]
    assert host.stop("eu-west-2")["eu-west-2"] == ["eu-west-2: no servelab instance 'seed001'"]
    assert ec2.describe_instances(InstanceIds=[iid])["Reservations"][0]["Instances"][0]["State"]["Name"] == "terminated"


def test_single_instance_reads_the_public_gpu_ami_parameter(aws):
    host = SingleInstanceHost(si_params(["eu-west-2"], ami_parameter=GPU_AMI_PARAMETER), boto3.Session)
    want = boto3.client("ssm", region_name="eu-west-2").get_parameter(Name=GPU_AMI_PARAMETER)["Parameter"]["Value"]
    assert host.ami("eu-west-2") == want and want.startswith("ami-")


def test_single_instance_refuses_secrets_in_user_data(aws):
    host = SingleInstanceHost(si_params(["eu-west-2"], secret_parameters={"HF_TOKEN": "/servelab/hf-token"}),
                              boto3.Session)
    with pytest.raises(AwsHostError, match="looks secret"):
        host.user_data(COMMAND_A, {"HF_TOKEN": "hf_abc"}, "eu-west-2")
    ud = host.user_data(COMMAND_A, {}, "eu-west-2")
    assert "export HF_TOKEN=$(aws ssm get-parameter --region eu-west-2 --with-decryption --name /servelab/hf-token" in ud
    assert " -e HF_TOKEN " in ud and "hf_abc" not in ud
    logged = SingleInstanceHost(si_params(["eu-west-2"], log_group="/servelab/engine"), boto3.Session)
    ud = logged.user_data(COMMAND_B, {"A": "x y"}, "eu-west-2")
    assert '--log-opt awslogs-create-group=true --log-opt "awslogs-stream=$IID"' in ud
    assert "-e 'A=x y'" in ud and "'{\"mode\":0,\"cudagraph_mode\":\"FULL_DECODE_ONLY\"}'" in ud
    import subprocess

    assert subprocess.run(["bash", "-n"], input=ud, text=True).returncode == 0  # valid shell


def test_plans_call_no_aws():
    def no_aws(region):
        raise AssertionError("plan() must not touch AWS")

    ecs_plan = EcsServiceHost(params(["ap-northeast-1", "eu-west-2"]), no_aws).plan(
        {"eager": COMMAND_A, "cuda-graph": COMMAND_B})
    assert ecs_plan[0].startswith("aws: ecs-service llm/llm-deepseek-v4-flash, g7e.12xlarge; regions in order "
                                  "ap-northeast-1, eu-west-2")
    assert sum("ecs:RegisterTaskDefinition" in ln for ln in ecs_plan) == 2
    assert any("[eager] ecs:UpdateService llm-deepseek-v4-flash desiredCount=1" in ln for ln in ecs_plan)
    assert any("[cuda-graph] ecs:UpdateService taskDefinition=<new>" in ln for ln in ecs_plan)
    assert ecs_plan[-1] == ("aws: limit: stop after 8 h (elapsed hours x hourly price); every failure path runs "
                            "the stop above")
    si_plan = SingleInstanceHost(si_params(["eu-west-2"]), no_aws).plan({"eager": COMMAND_A})
    assert any("ssm:GetParameter /servelab/test/gpu-ami" in ln for ln in si_plan)
    assert any("self-shutdown after 3 h" in ln for ln in si_plan)


def test_plan_lines_only_for_an_aws_host():

    from servelab.schema import load_study

    study = load_study(ROOT / "params" / "local-cpu-kv.yaml")
    assert for_study(study).plan_lines({c.id: study.engine_for(c.id) for c in study.configurations}) == []


# -- the deadline AWS enforces, through the pipeline's AwsHost -----------------------------------
def _seed001_on(region: str, tmp_path, monkeypatch, **aws_kw):
    """Seed 001's study pointed at build_stack's names in `region` (no CloudFormation stack)."""

    import yaml

    from servelab.schema import load_study

    monkeypatch.setenv("SERVELAB_RUNS", str(tmp_path / "runs"))
    d = yaml.safe_load((ROOT / "params" / "seed-001-vllm-g7e.yaml").read_text())
    d["host"]["aws"].pop("stack")
    d["host"]["aws"].update({"regions": [region], "cluster": CLUSTER, "service": SERVICE, "container_name": "vllm",
                             "hourly_usd": 8.2861, **aws_kw})
    p = tmp_path / "seed-001.yaml"
    p.write_text(yaml.safe_dump(d))
    return load_study(p)


def test_killed_run_leaves_the_deadline_action_in_place(aws, tmp_path, monkeypatch):
    """AwsHost sets the deadline on the group before the service scales out and records it; a
    process that dies mid-benchmark (no teardown) leaves it in AWS; a later teardown clears it."""
    from servelab.hosts.aws import host as aws_host
    from servelab.runfolder import read_json

    build_stack("eu-west-2")
    auto = boto3.client("autoscaling", region_name="eu-west-2")
    auto.update_auto_scaling_group(AutoScalingGroupName=POOL, MaxSize=0)  # as an earlier deadline left it
    cloud = Cloud(["eu-west-2"])
    monkeypatch.setattr(aws_host, "make_host", lambda p, kind="aws-ecs", **kw: EcsServiceHost(
        p, cloud.factory, sleep=cloud.sleep, clock=cloud.clock))
    study = _seed001_on("eu-west-2", tmp_path, monkeypatch)
    host = aws_host.AwsHost(study, "aws-ecs")
    host.check()
    calls: list[str] = []
    session = host.boto_host().session("eu-west-2")
    for event in ("auto-scaling.PutScheduledUpdateGroupAction", "auto-scaling.UpdateAutoScalingGroup",
                  "ecs.UpdateService"):
        session.events.register(f"before-parameter-build.{event}", lambda model, params, **_: calls.append(
            f"{model.name} {params.get('desiredCount', params.get('MaxSize', ''))}".strip()))
    t0 = cloud.now
    rdir = tmp_path / "runs" / study.study / "eager"
    rec = host.provision("eager", rdir, resolve_profile(study, "eager"))
    # MaxSize restored, then the deadline, then (only then) the service asks for the GPU
    assert calls[:3] == ["UpdateAutoScalingGroup 1", "PutScheduledUpdateGroupAction 0", "UpdateService 1"]
    want = datetime.fromtimestamp(t0 + 8 * 3600, timezone.utc).replace(microsecond=0)
    assert rec["deadline"]["asg"] == POOL and rec["deadline"]["hours"] == 8  # 8 h < 150 USD / 8.2861 USD/h
    assert rec["deadline"]["why"] == "max_hours 8"
    assert datetime.fromisoformat(rec["deadline"]["utc"]) == want
    assert read_json(rdir / "host.json")["aws"]["deadline"] == rec["deadline"]  # -> run.json's server.aws
    assert read_json(host.state_path())["deadline"] == rec["deadline"]
    # ... the process dies here: no stop, no teardown. What AWS holds:
    del host
    actions = auto.describe_scheduled_actions(AutoScalingGroupName=POOL)["ScheduledUpdateGroupActions"]
    assert [(a["ScheduledActionName"], a["MinSize"], a["MaxSize"], a["DesiredCapacity"]) for a in actions] == [
        ("servelab-deadline", 0, 0, 0)]
    assert actions[0]["StartTime"].astimezone(timezone.utc) == want
    tags = {t["Key"]: t["Value"] for t in auto.describe_auto_scaling_groups(
        AutoScalingGroupNames=[POOL])["AutoScalingGroups"][0]["Tags"]}
    assert tags["servelab:deadline"] == want.isoformat()
    assert state("eu-west-2")["desired"] == 1  # the GPU still runs: only the deadline will stop it
    # a later servelab (the state file survived) stops the host and, the stop being clean, clears it
    out = aws_host.AwsHost(study, "aws-ecs").teardown()
    assert stopped("eu-west-2") and "deadline servelab-deadline on g7e-2gpu cleared" in out
    assert auto.describe_scheduled_actions(AutoScalingGroupName=POOL)["ScheduledUpdateGroupActions"] == []


def test_deadline_hours_are_the_earlier_of_the_two_limits():
    host = EcsServiceHost(params(["eu-west-2"], max_hours=8, max_spend_usd=20, hourly_usd=8.2861), lambda r: None)
    hours, why = host.limit_hours("eu-west-2")
    assert hours == pytest.approx(20 / 8.2861) and why == "max_spend_usd 20 at 8.2861 USD/h"
    assert host.deadline_record("eu-west-2") is None  # only when AwsHost arms it
    host.arm_deadline = True
    rec = host.deadline_record("eu-west-2")
    assert rec["hours"] == pytest.approx(2.4137, abs=1e-4) and rec["why"] == why
    only_hours = EcsServiceHost(params(["eu-west-2"], max_hours=3, hourly_usd=None), lambda r: None)
    assert only_hours.limit_hours("eu-west-2") == (3, "max_hours 3")
