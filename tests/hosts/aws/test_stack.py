"""servelab.hosts.aws (stack, deadline, billing) against moto: template lint, up -> status -> down, deadline, shared capacity.

What moto (5.2) cannot do, and how these tests stay honest about it (each shim is named
`moto_*` and does through the service APIs what real CloudFormation / ECS would do):
- moto's CloudFormation skips AWS::ECS::CapacityProvider and
  AWS::ECS::ClusterCapacityProviderAssociations (a warning, no resource, no output):
  `moto_capacity_provider` creates and associates them through the ECS API after `up`;
- moto has no ECS managed scaling: `moto_start` sets the service to 1 and the ASG to 1
  (what the capacity provider would do), so an instance and its root volume really exist;
- moto's delete_stack does not delete AWS::EC2::NatGateway, EIP, VPCEndpoint, RouteTable,
  InternetGateway, ECS services/clusters or ELBv2 listeners/target groups (and then fails with
  DependencyViolation on the VPC): `moto_cloudformation_deletes` hooks DeleteStack and deletes
  those types first, as CloudFormation does. `test_down_reports_leftovers_without_the_shim`
  shows what down() says when they survive;
- moto stores no capacityProviderStrategy on a service: the second service in the shared test
  shows up as launchType EC2 in the same cluster, which `uses_capacity` also counts as sharing
  (`test_uses_capacity_rules` covers the strategy forms with describe_services shapes);
- moto fails a stack synchronously (create_stack raises) instead of going CREATE_FAILED,
  and enforces no EIP quota: `test_failed_up_leaves_nothing` makes moto's allocate_address
  fail once with AWS's AddressLimitExceeded; the asynchronous real-AWS sequence is replayed
  with a botocore Stubber in `test_failed_up_the_real_aws_way_reports_events_oldest_first`;
- moto gives every instance its own 8 GiB gp2 root volume besides the launch template's gp3
  /dev/xvda one, and ignores the launch template's MetadataOptions/TagSpecifications (the
  template itself is checked in `test_template_is_the_seeds_stack`).
Everything else (VPC, subnets, NAT, EIP, endpoints, SGs, IAM, log group, cluster, launch
template, ASG, task definition, ALB, target group, listener, service) moto's CloudFormation
creates for real from the template; the tests count what exists in the moto account.
"""

from __future__ import annotations

import argparse
import logging
import warnings
from datetime import UTC, datetime, timedelta

import boto3
import botocore.loaders
import botocore.session
import pytest

moto = pytest.importorskip("moto")
from moto import mock_aws
from servelab import cli_aws
from servelab.hosts.aws import billing as bill
from servelab.hosts.aws import deadline as dl
from servelab.hosts.aws import errors as err
from servelab.hosts.aws import session as ses
from servelab.hosts.aws import stack as st
from paths import ROOT

REGION = "us-east-1"
STACK = "sl-test"


@pytest.fixture(autouse=True)
def quiet_moto():
    logging.getLogger("moto").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*not supported by moto.*")
        warnings.filterwarnings("ignore", message=".*does not match an error shape.*")  # moto's serializer
        yield


@pytest.fixture
def aws(monkeypatch):
    for k, v in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                 ("AWS_DEFAULT_REGION", REGION)):
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    with mock_aws():
        yield


def moto_cloudformation_deletes(session: boto3.Session) -> None:
    """Before DeleteStack, delete the stack's resources of the types moto's delete leaves behind."""
    def before_delete(params, **_):
        cf = session.client("cloudformation")
        res = {}
        for page in cf.get_paginator("list_stack_resources").paginate(StackName=params["StackName"]):
            for r in page["StackResourceSummaries"]:
                if r.get("PhysicalResourceId"):
                    res.setdefault(r["ResourceType"], []).append(r["PhysicalResourceId"])
        ec2, ecs, elb = session.client("ec2"), session.client("ecs"), session.client("elbv2")
        clusters = res.get("AWS::ECS::Cluster", [])
        for cluster in clusters:
            for c in ecs.describe_clusters(clusters=[cluster])["clusters"]:
                for svc in ecs.list_services(cluster=cluster)["serviceArns"]:
                    ecs.delete_service(cluster=cluster, service=svc, force=True)
                cps = c.get("capacityProviders", [])
                ecs.put_cluster_capacity_providers(cluster=cluster, capacityProviders=[],
                                                   defaultCapacityProviderStrategy=[])
                for cp in cps:
                    ecs.delete_capacity_provider(capacityProvider=cp)
                ecs.delete_cluster(cluster=cluster)
        for arn in res.get("AWS::ElasticLoadBalancingV2::Listener", []):
            elb.delete_listener(ListenerArn=arn)
        for arn in res.get("AWS::ElasticLoadBalancingV2::TargetGroup", []):
            elb.delete_target_group(TargetGroupArn=arn)
        if res.get("AWS::EC2::VPCEndpoint"):
            ec2.delete_vpc_endpoints(VpcEndpointIds=res["AWS::EC2::VPCEndpoint"])
        for nat in res.get("AWS::EC2::NatGateway", []):
            ec2.delete_nat_gateway(NatGatewayId=nat)
        for ip in res.get("AWS::EC2::EIP", []):
            for addr in ec2.describe_addresses(PublicIps=[ip])["Addresses"]:
                ec2.release_address(AllocationId=addr["AllocationId"])
        for rtb in set(res.get("AWS::EC2::RouteTable", [])):
            for t in ec2.describe_route_tables(RouteTableIds=[rtb])["RouteTables"]:
                for assoc in t.get("Associations", []):
                    if not assoc.get("Main"):
                        ec2.disassociate_route_table(AssociationId=assoc["RouteTableAssociationId"])
            ec2.delete_route_table(RouteTableId=rtb)
        vpcs = res.get("AWS::EC2::VPC", [])
        for igw in res.get("AWS::EC2::InternetGateway", []):
            for vpc in vpcs:
                ec2.detach_internet_gateway(InternetGatewayId=igw, VpcId=vpc)
            ec2.delete_internet_gateway(InternetGatewayId=igw)
    session.events.register("before-parameter-build.cloudformation.DeleteStack", before_delete)


_MODELS = botocore.loaders.create_loader()  # service models read once for the whole file


def make_factory(emulate_deletes: bool = True):
    """session_factory for the stack functions: one moto session per region, all sharing one botocore
    model loader (reading the service JSON per session is most of the time otherwise)."""
    sessions: dict[str, boto3.Session] = {}

    def factory(region: str) -> boto3.Session:
        if region not in sessions:
            core = botocore.session.get_session()
            core.register_component("data_loader", _MODELS)
            sessions[region] = boto3.Session(region_name=region, aws_access_key_id="testing",
                                             aws_secret_access_key="testing", botocore_session=core)
            if emulate_deletes:
                moto_cloudformation_deletes(sessions[region])
        return sessions[region]
    return factory


def moto_capacity_provider(session: boto3.Session, outs: dict[str, str]) -> str:
    """Create + associate what moto's CloudFormation skipped; returns the capacity provider name."""
    asg_arn = session.client("autoscaling").describe_auto_scaling_groups(
        AutoScalingGroupNames=[outs["AsgName"]])["AutoScalingGroups"][0]["AutoScalingGroupARN"]
    ecs = session.client("ecs")
    name = f"{STACK}-CapacityProvider"
    ecs.create_capacity_provider(name=name, autoScalingGroupProvider={
        "autoScalingGroupArn": asg_arn, "managedScaling": {"status": "ENABLED", "targetCapacity": 100},
        "managedTerminationProtection": "DISABLED"})
    ecs.put_cluster_capacity_providers(cluster=outs["ClusterName"], capacityProviders=[name],
                                       defaultCapacityProviderStrategy=[{"capacityProvider": name, "weight": 1}])
    return name


def moto_start(session: boto3.Session, outs: dict[str, str]) -> None:
    """start = service desired 1; the capacity provider's scale-out (ASG to 1) done by hand."""
    session.client("ecs").update_service(cluster=outs["ClusterName"], service=outs["ServiceName"], desiredCount=1)
    session.client("autoscaling").set_desired_capacity(AutoScalingGroupName=outs["AsgName"], DesiredCapacity=1)


def account_billables(session: boto3.Session) -> dict[str, list[str]]:
    """Everything billable in the (moto) account, by kind, whatever its tags."""
    ec2, elb = session.client("ec2"), session.client("elbv2")
    return {
        "instances": [i["InstanceId"] for r in ec2.describe_instances()["Reservations"] for i in r["Instances"]
                      if i["State"]["Name"] != "terminated"],
        "nat": [n["NatGatewayId"] for n in ec2.describe_nat_gateways()["NatGateways"] if n["State"] != "deleted"],
        "lb": [lb["LoadBalancerArn"] for lb in elb.describe_load_balancers()["LoadBalancers"]],
        "volumes": [v["VolumeId"] for v in ec2.describe_volumes()["Volumes"]],
        "eip": [a["PublicIp"] for a in ec2.describe_addresses()["Addresses"]],
        "endpoints": [e["VpcEndpointId"] for e in ec2.describe_vpc_endpoints()["VpcEndpoints"]
                      if e["State"].lower() != "deleted"],
    }


EMPTY = {"instances": [], "nat": [], "lb": [], "volumes": [], "eip": [], "endpoints": []}
PARAMS = ses.StackParams(STACK, REGION, {"InstanceType": "g7e.12xlarge"})
NO_SLEEP = {"sleep": lambda s: None}


def test_template_passes_cfn_lint():
    lint = pytest.importorskip("cfnlint.api")
    body = st.TEMPLATE_PATH.read_text()
    config = lint.ManualArgs(regions=[REGION, "eu-west-2"], include_checks=["I"])  # informational too
    assert [f"{m.rule.id} {m.message} (line {m.linenumber})" for m in lint.lint(body, config=config)] == []
    # the linter does catch a broken copy, so the empty list above means something
    bad = body.replace("Type: AWS::ECS::Service", "Type: AWS::ECS::Servic")
    assert [(m.rule.id, m.message) for m in lint.lint(bad, config=lint.ManualArgs(regions=[REGION]))] == [
        ("E3006", f"Resource type 'AWS::ECS::Servic' does not exist in '{REGION}'")]


def test_template_is_the_seeds_stack():
    t = bill.load_template(st.TEMPLATE_PATH)
    assert len(st.TEMPLATE_PATH.read_bytes()) < 51_200  # create_stack's TemplateBody limit
    r = t["Resources"]
    lt = r["LaunchTemplate"]["Properties"]["LaunchTemplateData"]
    assert lt["MetadataOptions"]["HttpTokens"] == "required" and lt["MetadataOptions"]["HttpPutResponseHopLimit"] == 2
    assert lt["BlockDeviceMappings"][0]["Ebs"] == {"VolumeType": "gp3", "VolumeSize": {"Ref": "RootVolumeGiB"},
                                                   "Encrypted": True, "DeleteOnTermination": True}
    user_data = lt["UserData"]["Fn::Base64"]["Fn::Sub"]
    for line in ("ECS_CLUSTER=${Cluster}", "ECS_ENABLE_GPU_SUPPORT=true", "ECS_ENABLE_TASK_IAM_ROLE=true",
                 "mkdir -p /var/lib/llm-model-cache"):
        assert line in user_data
    assert t["Parameters"]["AmiId"]["Default"] == (
        "/aws/service/ecs/optimized-ami/amazon-linux-2023/gpu/recommended/image_id")
    asg = r["AutoScalingGroup"]["Properties"]
    assert (asg["MinSize"], asg["MaxSize"], "DesiredCapacity" in asg) == ("0", "1", False)
    assert r["Service"]["Properties"]["DesiredCount"] == {"Ref": "ServiceDesiredCount"}
    assert t["Parameters"]["ServiceDesiredCount"]["Default"] == 0
    assert r["TaskSecurityGroup"]["Properties"]["SecurityGroupIngress"] == [{
        "IpProtocol": "tcp", "FromPort": {"Ref": "ContainerPort"}, "ToPort": {"Ref": "ContainerPort"},
        "SourceSecurityGroupId": {"Ref": "AlbSecurityGroup"}}]
    assert "SecurityGroupIngress" not in r["InstanceSecurityGroup"]["Properties"]
    tg = r["TargetGroup"]["Properties"]
    assert (tg["TargetType"], tg["HealthCheckPath"], tg["Matcher"]) == ("ip", {"Ref": "HealthCheckPath"},
                                                                         {"HttpCode": "200"})
    assert r["LoadBalancer"]["Properties"]["Scheme"] == "internal" and r["Listener"]["Properties"]["Port"] == 80
    engine = r["TaskDefinition"]["Properties"]["ContainerDefinitions"][0]
    assert engine["ResourceRequirements"] == [{"Type": "GPU", "Value": {"Ref": "GpuCount"}}]
    assert engine["LogConfiguration"]["LogDriver"] == "awslogs"
    # every resource that takes Tags carries servelab:stack=<stack name>
    tagged = {lid for lid, res in r.items() if any(
        tag == {"Key": "servelab:stack", "Value": {"Ref": "AWS::StackName"}} | ({"PropagateAtLaunch": True}
                                                                              if "PropagateAtLaunch" in tag else {})
        for tag in res.get("Properties", {}).get("Tags", []))}
    untagged = sorted(lid for lid in r if lid not in tagged)
    assert [r[lid]["Type"] for lid in untagged] == [r[lid]["Type"] for lid in untagged if r[lid]["Type"] in (
        "AWS::EC2::SubnetRouteTableAssociation", "AWS::EC2::VPCGatewayAttachment", "AWS::EC2::Route",
        "AWS::IAM::InstanceProfile", "AWS::ECS::ClusterCapacityProviderAssociations",
        "AWS::ElasticLoadBalancingV2::Listener", "AWS::EC2::LaunchTemplate")]  # no Tags property
    assert "LaunchTemplate" in untagged and {x["ResourceType"] for x in lt["TagSpecifications"]} == {
        "instance", "volume", "network-interface"}


def test_plan_lists_resources_and_sums_hourly_items():
    pl = st.plan(PARAMS, instance_hourly_usd=8.2861)
    ids = dict(pl.resources)
    assert ids["NatGateway"] == "AWS::EC2::NatGateway" and ids["CapacityProvider"] == "AWS::ECS::CapacityProvider"
    tmpl = bill.load_template(st.TEMPLATE_PATH)
    assert [lid for lid, _ in pl.resources] == [lid for lid, r in tmpl["Resources"].items()
                                                if r.get("Condition") in (None, "UseNat")]
    assert "EcrApiEndpoint" not in ids and len(pl.resources) == 34
    prices = bill.load_fixed_prices(REGION)
    assert pl.idle_hourly_usd == pytest.approx(sum(i.usd for i in pl.idle_items))
    assert pl.idle_hourly_usd == pytest.approx(prices["nat_gateway_hour"] + prices["public_ipv4_hour"]
                                               + prices["alb_hour"] + prices["alb_lcu_hour"])
    root_hourly = 300 * prices["ebs_gp3_gb_month"] / 730
    assert pl.running_hourly_usd == pytest.approx(pl.idle_hourly_usd + root_hourly + 8.2861)
    assert pl.running_hourly_usd == pytest.approx(sum(i.usd for i in pl.running_items))
    ep = st.plan(ses.StackParams(STACK, REGION, {"Egress": "endpoints"}), instance_hourly_usd=None)
    ep_ids = dict(ep.resources)
    assert "NatGateway" not in ep_ids and "InternetGateway" not in ep_ids
    interface = {r["Properties"]["ServiceName"]["Fn::Sub"].split("}.")[1]
                 for r in tmpl["Resources"].values() if r["Properties"].get("VpcEndpointType") == "Interface"}
    assert interface == set(bill.INTERFACE_ENDPOINTS) and len(interface) == 9  # incl. ecs, ecs-agent, ecs-telemetry
    assert sum(t == "AWS::EC2::VPCEndpoint" for _, t in ep.resources) == len(interface) + 1  # + S3 gateway
    assert ep.idle_hourly_usd == pytest.approx(2 * len(interface) * prices["vpc_endpoint_az_hour"]
                                               + prices["alb_hour"] + prices["alb_lcu_hour"])
    with pytest.raises(err.StackError, match="Bogus"):
        st.plan(ses.StackParams(STACK, REGION, {"Bogus": "1"}), instance_hourly_usd=1.0)
    with pytest.raises(err.StackError, match="Egress='vpn' is not one of nat, endpoints"):
        st.plan(ses.StackParams(STACK, REGION, {"Egress": "vpn"}), instance_hourly_usd=1.0)
    eu = st.plan(ses.StackParams(STACK, "eu-west-2"), instance_hourly_usd=None)
    assert eu.idle_hourly_usd == pytest.approx(sum(bill.load_fixed_prices("eu-west-2")[k] for k in (
        "nat_gateway_hour", "public_ipv4_hour", "alb_hour", "alb_lcu_hour")))


def test_monthly_breakdown_names_the_gap_to_seed_001():
    m = bill.monthly_breakdown(REGION, instance_hourly_usd=8.2861, nat_gb=500, logs_gb=5,
                               reference_monthly_usd=8887)
    names = [i.name for i in m["items"]]
    assert any("GPU instance" in n for n in names) and any("NAT gateway" == n for n in names)
    instance = next(i.usd for i in m["items"] if "GPU instance" in i.name)
    assert instance == pytest.approx(8.2861 * 730)  # ~6,049 USD, the instance alone
    assert m["total_usd"] == pytest.approx(sum(i.usd for i in m["items"]))
    assert m["unexplained_usd"] == pytest.approx(8887 - m["total_usd"])
    assert 2500 < m["unexplained_usd"] < 2800  # fixed items explain ~80 USD + data, not the rest


def test_up_status_down_leaves_nothing(aws):
    factory = make_factory()
    s = factory(REGION)
    before = account_billables(s)
    outs = st.up(PARAMS, session_factory=factory, **NO_SLEEP)
    assert outs["ClusterName"] == f"{STACK}-cluster" and outs["LogGroupName"] == f"/servelab/{STACK}/engine"
    assert "CapacityProviderName" not in outs  # moto skipped it: see the module docstring
    moto_capacity_provider(s, outs)
    items, total = st.status(PARAMS, session_factory=factory, instance_hourly_usd={"g7e.12xlarge": 8.2861})
    assert sorted(b.kind for b in items) == ["load-balancer", "nat-gateway", "public-ipv4"]
    moto_start(s, outs)
    items, total = st.status(PARAMS, session_factory=factory, instance_hourly_usd={"g7e.12xlarge": 8.2861})
    kinds = sorted(b.kind for b in items)
    # two volumes: the template's gp3 root (/dev/xvda, RootVolumeGiB) and moto's own 8 GiB gp2
    # root that it adds to every instance (real AWS has the one /dev/xvda volume)
    assert kinds == ["ebs-volume", "ebs-volume", "instance", "load-balancer", "nat-gateway", "public-ipv4"]
    assert sorted(b.detail for b in items if b.kind == "ebs-volume") == ["gp2 8 GiB in-use", "gp3 300 GiB in-use"]
    assert total == pytest.approx(sum(b.hourly_usd for b in items))
    assert next(b for b in items if b.kind == "instance").hourly_usd == 8.2861
    log = st.down(PARAMS, session_factory=factory, **NO_SLEEP)
    assert any("1 instance(s) terminated" in line for line in log) and log[-1].startswith("verified")
    assert before == account_billables(s) == EMPTY
    assert s.client("cloudformation").list_stacks(StackStatusFilter=["CREATE_COMPLETE"])["StackSummaries"] == []
    with pytest.raises(err.StackNotFound):
        st.status(PARAMS, session_factory=factory)


def test_endpoints_egress_bills_interface_endpoints_and_down_removes_them(aws):
    factory = make_factory()
    params = ses.StackParams(STACK, REGION, {"Egress": "endpoints"})
    st.up(params, session_factory=factory, **NO_SLEEP)
    items, total = st.status(params, session_factory=factory)
    endpoints = sorted(b.detail for b in items if b.kind == "vpc-endpoint")
    assert endpoints == sorted(f"{svc.split('.')[-1]} x 2 AZ" for svc in bill.INTERFACE_ENDPOINTS)
    assert "nat-gateway" not in {b.kind for b in items}
    per_az = bill.load_fixed_prices(REGION)["vpc_endpoint_az_hour"]
    assert sum(b.hourly_usd for b in items if b.kind == "vpc-endpoint") == pytest.approx(
        2 * len(bill.INTERFACE_ENDPOINTS) * per_az)
    assert total == pytest.approx(st.plan(params, instance_hourly_usd=None).idle_hourly_usd)
    st.down(params, session_factory=factory, **NO_SLEEP)
    assert account_billables(factory(REGION)) == EMPTY


def test_up_again_updates_and_keeps_previous_parameters(aws):
    factory = make_factory()
    st.up(ses.StackParams(STACK, REGION, {"InstanceType": "g7e.24xlarge", "GpuCount": "4"}),
          session_factory=factory, **NO_SLEEP)
    st.up(ses.StackParams(STACK, REGION, {"EngineImage": "lmsysorg/sglang:v0.5"}), session_factory=factory, **NO_SLEEP)
    stack = factory(REGION).client("cloudformation").describe_stacks(StackName=STACK)["Stacks"][0]
    values = {p["ParameterKey"]: p["ParameterValue"] for p in stack["Parameters"]}
    assert stack["StackStatus"] == "UPDATE_COMPLETE"
    assert (values["InstanceType"], values["GpuCount"], values["EngineImage"]) == (
        "g7e.24xlarge", "4", "lmsysorg/sglang:v0.5")


def test_down_reports_leftovers_without_the_shim(aws):
    """Without moto_cloudformation_deletes moto's delete_stack fails on the VPC: down says so."""
    factory = make_factory(emulate_deletes=False)
    st.up(PARAMS, session_factory=factory, **NO_SLEEP)
    with pytest.raises(err.StackError, match="DependencyViolation"):
        st.down(PARAMS, session_factory=factory, **NO_SLEEP)
    items, _ = st.status(PARAMS, session_factory=factory)
    assert {"nat-gateway", "public-ipv4"} <= {b.kind for b in items}


def test_killed_mid_benchmark_leaves_deadline_in_aws(aws):
    factory = make_factory()
    outs = st.up(PARAMS, session_factory=factory, **NO_SLEEP)
    moto_start(factory(REGION), outs)
    deadline = datetime.now(UTC).replace(microsecond=0) + timedelta(hours=3)
    dl.set_deadline(outs["AsgName"], deadline, region=REGION, session_factory=factory)
    # ... the process dies here: no down, no clear_deadline. What AWS holds:
    asg = factory(REGION).client("autoscaling")
    actions = asg.describe_scheduled_actions(AutoScalingGroupName=outs["AsgName"])["ScheduledUpdateGroupActions"]
    assert [(a["ScheduledActionName"], a["MinSize"], a["MaxSize"], a["DesiredCapacity"]) for a in actions] == [
        ("servelab-deadline", 0, 0, 0)]
    assert actions[0]["StartTime"].astimezone(UTC) == deadline
    tags = {t["Key"]: t["Value"] for t in asg.describe_auto_scaling_groups(
        AutoScalingGroupNames=[outs["AsgName"]])["AutoScalingGroups"][0]["Tags"]}
    assert tags["servelab:deadline"] == deadline.isoformat()
    assert dl.deadline_of(outs["AsgName"], region=REGION, session_factory=factory) == {
        "scheduled_utc": deadline, "tag_utc": deadline}
    dl.clear_deadline(outs["AsgName"], region=REGION, session_factory=factory)
    assert dl.deadline_of(outs["AsgName"], region=REGION, session_factory=factory) is None
    with pytest.raises(ValueError, match="future"):
        dl.set_deadline(outs["AsgName"], datetime.now(UTC), region=REGION, session_factory=factory)


def test_down_refuses_shared_capacity_then_force_warns(aws):
    factory = make_factory()
    s = factory(REGION)
    outs = st.up(PARAMS, session_factory=factory, **NO_SLEEP)
    cp = moto_capacity_provider(s, outs)
    moto_start(s, outs)
    ecs = s.client("ecs")
    td = ecs.describe_services(cluster=outs["ClusterName"], services=[outs["ServiceName"]])["services"][0]["taskDefinition"]
    ecs.create_service(cluster=outs["ClusterName"], serviceName="other-model", taskDefinition=td, desiredCount=1,
                       capacityProviderStrategy=[{"capacityProvider": cp, "weight": 1}])
    with pytest.raises(err.SharedCapacity) as e:
        st.down(PARAMS, session_factory=factory, **NO_SLEEP)
    other = ecs.describe_services(cluster=outs["ClusterName"], services=["other-model"])["services"][0]
    assert e.value.services == [f"{STACK}-cluster/other-model (desired 1, running {other['runningCount']})"]
    assert outs["ServiceName"] not in str(e.value.services)  # our own service is not "another"
    assert account_billables(s)["instances"]  # refused before the group was touched
    with pytest.warns(UserWarning, match="other-model"):
        log = st.down(PARAMS, session_factory=factory, force=True, **NO_SLEEP)
    assert log[-1].startswith("verified") and account_billables(s) == EMPTY


def test_uses_capacity_rules():
    assert bill.uses_capacity({"capacityProviderStrategy": [{"capacityProvider": "cp"}]}, "cp", [])
    assert not bill.uses_capacity({"capacityProviderStrategy": [{"capacityProvider": "other"}]}, "cp", ["cp"])
    assert bill.uses_capacity({"launchType": "EC2"}, "cp", [])
    assert not bill.uses_capacity({"launchType": "FARGATE"}, "cp", ["cp"])
    assert bill.uses_capacity({}, "cp", ["cp"]) and not bill.uses_capacity({}, "cp", ["x"])


def test_failed_up_leaves_nothing(aws, monkeypatch):
    """The NAT's Elastic IP hits the account's address quota (a common real create failure)
    after the VPC, subnets, gateway and route tables exist; up must leave nothing behind.

    moto enforces no EIP quota, so the test makes moto's allocate_address fail once with
    AWS's error. (moto then fails create_stack inline instead of going CREATE_FAILED, and
    evaluates the rest of the stack lazily on the next describe: up copes with both.)"""
    from moto.ec2.exceptions import EC2ClientError
    from moto.ec2.models.elastic_ip_addresses import ElasticAddressBackend

    class AddressLimitExceeded(EC2ClientError):
        code, message = "AddressLimitExceeded", "The maximum number of addresses has been reached."

    real, calls = ElasticAddressBackend.allocate_address, []

    def allocate_once_failing(self, *a, **k):
        calls.append(len(self.vpcs))  # VPCs in the account at this moment
        if len(calls) == 1:
            raise AddressLimitExceeded()
        return real(self, *a, **k)
    monkeypatch.setattr(ElasticAddressBackend, "allocate_address", allocate_once_failing)
    factory = make_factory()
    s = factory(REGION)
    with pytest.raises(err.StackFailed, match="AddressLimitExceeded") as e:
        st.up(PARAMS, session_factory=factory, **NO_SLEEP)
    assert calls[0] == 2  # the default VPC and the stack's: the network existed when the EIP failed
    assert e.value.leftovers == [] and "nothing billable left" in str(e.value)
    assert account_billables(s) == EMPTY
    assert [v["VpcId"] for v in s.client("ec2").describe_vpcs()["Vpcs"] if not v["IsDefault"]] == []
    assert [i for i in s.client("ec2").describe_internet_gateways()["InternetGateways"]] == []
    with pytest.raises(err.StackNotFound):
        st.outputs(PARAMS, session_factory=factory)


def test_change_set_lists_changes_and_leaves_nothing(aws):
    factory = make_factory()
    changes = st.change_set(PARAMS, session_factory=factory, **NO_SLEEP)
    cf = factory(REGION).client("cloudformation")
    assert {c["logical_id"] for c in changes} >= {"Vpc", "NatGateway", "AutoScalingGroup", "Service"}
    assert {c["action"] for c in changes} == {"Add"}
    assert [x for x in cf.list_stacks()["StackSummaries"] if x["StackStatus"] != "DELETE_COMPLETE"] == []


def test_logs_and_tunnel(aws):
    factory = make_factory()
    s = factory(REGION)
    outs = st.up(PARAMS, session_factory=factory, **NO_SLEEP)
    with pytest.raises(err.StackError, match="no running instance"):
        st.tunnel_command(PARAMS, session_factory=factory)
    moto_start(s, outs)
    argv = st.tunnel_command(PARAMS, session_factory=factory, local_port=18080)
    iid = s.client("autoscaling").describe_auto_scaling_groups(
        AutoScalingGroupNames=[outs["AsgName"]])["AutoScalingGroups"][0]["Instances"][0]["InstanceId"]
    assert argv[argv.index("--target") + 1] == iid
    assert argv[argv.index("--document-name") + 1] == "AWS-StartPortForwardingSessionToRemoteHost"
    assert outs["LoadBalancerDns"] in argv[argv.index("--parameters") + 1] and '"18080"' in argv[-1]
    logs = s.client("logs")
    logs.create_log_stream(logGroupName=outs["LogGroupName"], logStreamName="engine/engine/abc")
    now_ms = int(datetime.now(UTC).timestamp() * 1000)
    logs.put_log_events(logGroupName=outs["LogGroupName"], logStreamName="engine/engine/abc", logEvents=[
        {"timestamp": now_ms - 90 * 60_000, "message": "old: model download"},
        {"timestamp": now_ms - 60_000, "message": "INFO Application startup complete."}])
    got = st.logs(PARAMS, since_min=30, session_factory=factory)
    assert [(stream, msg) for _, stream, msg in got] == [("engine/engine/abc", "INFO Application startup complete.")]


def test_failed_up_the_real_aws_way_reports_events_oldest_first(aws):
    """Real CloudFormation answers create_stack at once and fails later (OnFailure=DELETE:
    CREATE_IN_PROGRESS -> DELETE_IN_PROGRESS -> DELETE_COMPLETE). moto cannot do that, so
    CloudFormation is a botocore Stubber here; EC2/ELB (the leftover check) are moto's."""
    from botocore.stub import Stubber

    moto_session = make_factory(emulate_deletes=False)(REGION)
    cf = moto_session.client("cloudformation")
    stub = Stubber(cf)
    sid = f"arn:aws:cloudformation:{REGION}:123456789012:stack/{STACK}/abc"
    now = datetime(2026, 12, 1, tzinfo=UTC)

    def stack(status):
        return {"Stacks": [{"StackName": STACK, "StackId": sid, "StackStatus": status, "CreationTime": now}]}

    def event(lid, rtype, status, reason=""):
        return {"StackId": sid, "EventId": lid + status, "StackName": STACK, "LogicalResourceId": lid,
                "ResourceType": rtype, "Timestamp": now, "ResourceStatus": status, "ResourceStatusReason": reason}
    stub.add_client_error("describe_stacks", "ValidationError", f"Stack with id {STACK} does not exist")
    stub.add_response("create_stack", {"StackId": sid})
    for status in ("CREATE_IN_PROGRESS", "DELETE_IN_PROGRESS", "DELETE_COMPLETE"):
        stub.add_response("describe_stacks", stack(status), {"StackName": sid})
    stub.add_response("describe_stack_events", {"StackEvents": [  # newest first, as AWS sends them
        event(STACK, "AWS::CloudFormation::Stack", "DELETE_COMPLETE"),
        event("Service", "AWS::ECS::Service", "CREATE_FAILED", "Resource creation cancelled"),
        event("NatEip", "AWS::EC2::EIP", "CREATE_FAILED", "The maximum number of addresses has been reached."),
        event("Vpc", "AWS::EC2::VPC", "CREATE_COMPLETE")]}, {"StackName": sid})
    stub.add_response("describe_stacks", stack("DELETE_COMPLETE"), {"StackName": sid})
    stub.add_response("list_stack_resources", {"StackResourceSummaries": [
        {"LogicalResourceId": "NatGateway", "PhysicalResourceId": "nat-0123456789abcdef0",
         "ResourceType": "AWS::EC2::NatGateway", "LastUpdatedTimestamp": now, "ResourceStatus": "DELETE_COMPLETE"}]},
        {"StackName": sid})

    class Session:  # CloudFormation stubbed, everything else moto
        region_name = REGION

        def client(self, name):
            return cf if name == "cloudformation" else moto_session.client(name)

        def get_credentials(self):
            return moto_session.get_credentials()
    sleeps, ticks = [], iter(range(0, 10_000, 15))
    with stub, pytest.raises(err.StackFailed) as e:
        st.up(PARAMS, session_factory=lambda region: Session(), sleep=sleeps.append, clock=lambda: next(ticks))
    stub.assert_no_pending_responses()  # no delete_stack: OnFailure=DELETE had done it
    assert e.value.events == [
        "NatEip (AWS::EC2::EIP): CREATE_FAILED - The maximum number of addresses has been reached.",
        "Service (AWS::ECS::Service): CREATE_FAILED - Resource creation cancelled"]
    assert sleeps == [15, 15] and e.value.leftovers == []
    assert str(e.value).startswith(f"create of {STACK} failed (NatEip (AWS::EC2::EIP): CREATE_FAILED")


def _cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="servelab")
    cli_aws.add_parser(parser.add_subparsers(dest="command"))
    a = parser.parse_args(argv)
    return a.func(a)


def test_cli_up_dry_run_makes_no_aws_call(capsys, monkeypatch):
    def no_aws(*a, **k):
        raise AssertionError("AWS called during --dry-run")
    monkeypatch.setattr(boto3, "Session", no_aws)
    assert _cli(["aws", "up", "--stack", STACK, "--dry-run", "--instance-usd-per-hour", "8.2861"]) == 0
    out = capsys.readouterr().out
    pl = st.plan(PARAMS, instance_hourly_usd=8.2861)
    assert f"{len(pl.resources)} resources (no AWS call made)" in out and "NatGateway" in out
    assert f"{pl.running_hourly_usd:.4f} USD/h" in out and f"{pl.idle_hourly_usd:.4f} USD/h" in out


def test_cli_status_and_down_under_moto(aws, capsys, monkeypatch):
    # the CLI builds its sessions with default_session_factory: give it the moto-shimmed one
    factory = make_factory()
    monkeypatch.setattr(ses, "default_session_factory", lambda profile=None: factory)
    assert _cli(["aws", "status", "--stack", STACK]) == 1
    err = capsys.readouterr().err
    assert err.startswith("servelab aws status: stack sl-test does not exist") and err.count("\n") == 1
    monkeypatch.setattr(st.time, "sleep", lambda s: None)
    assert _cli(["aws", "up", "--stack", STACK, "--deadline-hours", "2"]) == 0
    out = capsys.readouterr().out
    asg_name = next(line.split(": ", 1)[1] for line in out.splitlines() if line.startswith("AsgName: "))
    assert f"deadline: {asg_name} scales to 0 at " in out
    assert dl.deadline_of(asg_name, region=REGION, session_factory=factory)["scheduled_utc"] is not None
    assert _cli(["aws", "status", "--stack", STACK]) == 0
    out = capsys.readouterr().out
    assert "3 billable resource(s)" in out and "nat-gateway" in out
    assert _cli(["aws", "down", "--stack", STACK]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("verified: no instance")
    assert account_billables(factory(REGION)) == EMPTY
    assert _cli(["aws", "down", "--stack", STACK]) == 1
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["status", "logs", "tunnel", "down"])
def test_cli_missing_stack_one_line(aws, capsys, monkeypatch, command):
    factory = make_factory()
    monkeypatch.setattr(ses, "default_session_factory", lambda profile=None: factory)
    assert _cli(["aws", command, "--stack", "nope"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"servelab aws {command}: stack nope does not exist in {REGION}") and err.count("\n") == 1


@pytest.mark.parametrize("command", ["up", "status", "logs", "tunnel", "down"])
def test_cli_missing_credentials_one_line(capsys, monkeypatch, tmp_path, command):
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    assert _cli(["aws", command, "--stack", STACK]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"servelab aws {command}: no AWS credentials") and err.count("\n") == 1


def test_start_restores_max_size_after_a_fired_deadline_and_sets_a_new_one(aws):
    factory = make_factory()
    s = factory(REGION)
    outs = st.up(PARAMS, session_factory=factory, **NO_SLEEP)
    auto, name = s.client("autoscaling"), outs["AsgName"]
    # the deadline fired (moto runs no scheduled actions: do what it did)
    auto.update_auto_scaling_group(AutoScalingGroupName=name, MinSize=0, MaxSize=0, DesiredCapacity=0)
    now = datetime.now(UTC).replace(microsecond=0)
    log = dl.start(PARAMS, deadline_hours=2, session_factory=factory, now_utc=lambda: now)
    when = (now + timedelta(hours=2)).isoformat(timespec="seconds")
    assert log == [f"ASG {name} MaxSize 0 -> 1 (a deadline or down had set 0)",
                   f"deadline: {name} scales to 0 at {when} (2 h, servelab-deadline)",
                   f"ecs:UpdateService {outs['ServiceName']} desiredCount=1 (the capacity provider scales {name} "
                   "0 -> 1; watch with servelab aws status)"]
    group = auto.describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"][0]
    assert group["MaxSize"] == 1
    svc = s.client("ecs").describe_services(cluster=outs["ClusterName"], services=[outs["ServiceName"]])["services"][0]
    assert svc["desiredCount"] == 1
    assert dl.deadline_of(name, region=REGION, session_factory=factory)["scheduled_utc"] == now + timedelta(hours=2)
    again = dl.start(PARAMS, deadline_hours=1, session_factory=factory, now_utc=lambda: now)
    assert not again[0].startswith("ASG")  # MaxSize already 1: nothing to restore
    with pytest.raises(ValueError, match="needs a deadline"):
        dl.start(PARAMS, deadline_hours=0, session_factory=factory)


def test_billing_line_answers_in_one_line():
    inst = bill.Billable("instance", "i-0abc", "g7e.12xlarge running", 8.2861, "running")
    nat = bill.Billable("nat-gateway", "nat-0abc", "available", 0.045, "available")
    when = datetime(2026, 12, 1, 17, 0, tzinfo=UTC)
    assert cli_aws.billing_line(STACK, [inst, nat], 8.3311, when) == (
        "BILLING: 1 GPU instance(s) running (i-0abc g7e.12xlarge running); 8.3311 USD/h in all; AWS deadline "
        "scales it to 0 at 2026-12-01T17:00:00+00:00")
    assert cli_aws.billing_line(STACK, [inst], 8.2861).endswith("; NO AWS deadline set (servelab aws start sets one)")
    assert cli_aws.billing_line(STACK, [nat], 0.045) == (
        "no GPU instance running; the idle stack still bills 0.0450 USD/h (nat-gateway): servelab aws down "
        f"--stack {STACK} removes it")
    assert cli_aws.billing_line(STACK, [], 0.0) == f"nothing of stack {STACK} bills now"


def test_servelab_cli_runs_aws_start_and_status(aws, capsys, monkeypatch):
    """`servelab aws ...` through servelab.cli.main (the wiring), under moto."""
    from servelab import cli

    factory = make_factory()
    monkeypatch.setattr(ses, "default_session_factory", lambda profile=None: factory)
    monkeypatch.setattr(st.time, "sleep", lambda s: None)
    assert cli.main(["aws", "up", "--stack", STACK]) == 0
    capsys.readouterr()
    assert cli.main(["aws", "status", "--stack", STACK]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith(
        "no GPU instance running; the idle stack still bills 0.0805 USD/h (load-balancer, nat-gateway, public-ipv4)")
    assert cli.main(["aws", "start", "--stack", STACK, "--deadline-hours", "3"]) == 0
    out = capsys.readouterr().out
    assert "ecs:UpdateService sl-test-engine desiredCount=1" in out and "(3 h, servelab-deadline)" in out
    outs = st.outputs(PARAMS, session_factory=factory)
    factory(REGION).client("autoscaling").set_desired_capacity(AutoScalingGroupName=outs["AsgName"],
                                                               DesiredCapacity=1)  # the capacity provider's part
    assert cli.main(["aws", "status", "--stack", STACK]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith("BILLING: 1 GPU instance(s) running (i-") and " g7e.12xlarge running); " in last
    assert "; AWS deadline scales it to 0 at " in last
    assert cli.main(["aws", "down", "--stack", STACK]) == 0
    assert account_billables(factory(REGION)) == EMPTY


def test_aws_host_creates_the_study_stack_and_arms_the_deadline_on_its_group(aws, monkeypatch, tmp_path):
    """host.aws.stack: AwsHost ups the stack first and takes cluster, service and group from its
    outputs; the deadline lands on the stack's group. (moto cannot run the awsvpc engine task,
    so the start itself stops at the deadline; tests/hosts/aws/test_ecs.py drives a whole start on build_stack.)"""

    import yaml

    from servelab.hosts.aws import host as aws_host
    from servelab.hosts.aws.ecs import EcsServiceHost
    from servelab.schema import load_study

    factory = make_factory()
    monkeypatch.setenv("SERVELAB_AWS_ACCOUNT_ID", "123456789012")  # moto's account
    monkeypatch.setenv("SERVELAB_RUNS", str(tmp_path / "runs"))
    d = yaml.safe_load((ROOT / "params" / "seed-001-vllm-g7e.yaml").read_text())
    d["host"]["aws"]["stack"]["name"] = STACK
    d["host"]["aws"]["hourly_usd"] = 8.2861
    p = tmp_path / "seed-001.yaml"
    p.write_text(yaml.safe_dump(d))
    study = load_study(p)
    monkeypatch.setattr(aws_host, "make_host", lambda params, kind="aws-ecs", **kw: EcsServiceHost(
        params, factory, sleep=lambda s: None))
    # a run that failed before the stack existed: teardown has nothing to stop (and does not fail)
    assert aws_host.AwsHost(study, "aws-ecs").teardown() == f"AWS host: stack {STACK} does not exist: nothing to stop"
    host = aws_host.AwsHost(study, "aws-ecs")
    host.check()
    h = host.boto_host()
    resolved = host._stack_up(h)
    outs = st.outputs(PARAMS, session_factory=factory)
    assert resolved == {"regions": [REGION], "cluster": outs["ClusterName"], "service": outs["ServiceName"],
                        "asg_name": outs["AsgName"], "target_group_arn": outs["TargetGroupArn"],
                        "log_group": outs["LogGroupName"], "container_name": "engine"}  # no CapacityProviderName: moto
    assert (h.p.cluster, h.p.service, h.p.regions) == (f"{STACK}-cluster", outs["ServiceName"], [REGION])
    stack = factory(REGION).client("cloudformation").describe_stacks(StackName=STACK)["Stacks"][0]
    assert {x["ParameterKey"]: x["ParameterValue"] for x in stack["Parameters"]}["EngineImage"] == (
        "vllm/vllm-openai:v0.26.0")
    h.arm_deadline = True
    h._arm_deadline(REGION, h._service(REGION))
    assert h.deadline["asg"] == outs["AsgName"] and h.deadline["hours"] == 8
    assert dl.deadline_of(outs["AsgName"], region=REGION, session_factory=factory)["scheduled_utc"] == (
        datetime.fromisoformat(h.deadline["utc"]))
    assert h.clear_deadline(h.deadline) == f"deadline servelab-deadline on {outs['AsgName']} cleared"
    assert dl.deadline_of(outs["AsgName"], region=REGION, session_factory=factory) is None
    # another process (no state file, outputs not read yet) tears down through the stack's outputs
    assert aws_host.AwsHost(study, "aws-ecs").teardown().startswith(f"AWS host stopped: {{'{REGION}': [")
    st.down(PARAMS, session_factory=factory, **NO_SLEEP)
    assert account_billables(factory(REGION)) == EMPTY
