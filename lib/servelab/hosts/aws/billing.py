"""What the ECS GPU stack bills for, by the hour: fixed prices, live billable resources, leftovers.

All money in USD. Pieces (`stack` builds on them):
- `load_fixed_prices` reads data/aws-fixed-prices.yaml (quoted list prices of the NAT
  gateway, ALB, gp3, public IPv4, interface endpoints, CloudWatch Logs) per region;
- `template_resources` reads templates/ecs-gpu-stack.yaml without AWS (the dry run), and
  `stack_hourly_items` / `monthly_breakdown` price it: per hour idle or running, and an
  itemised month that names the gap to the published 8,887 USD figure (data/seed001.yaml);
- `find_billable` lists what bills right now (instances, NAT gateways, load balancers, EBS
  volumes, Elastic IPs / public IPv4, interface endpoints), found through the stack's physical
  resource ids and through the servelab:stack tag;
- `other_services_on` / `uses_capacity`: which other ECS services keep the GPU pool busy.

boto3 clients only (sessions passed in); no other servelab module is imported.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

TAG_STACK = "servelab:stack"
PRICES_PATH = Path(__file__).resolve().parents[2] / "data" / "aws-fixed-prices.yaml"
INTERFACE_ENDPOINTS = ("ecr.api", "ecr.dkr", "logs", "ssm", "ssmmessages", "ec2messages",
                       "ecs", "ecs-agent", "ecs-telemetry")  # the template's Egress=endpoints
ALIVE_INSTANCE = ("pending", "running", "stopping", "stopped", "shutting-down")
ALIVE_NAT = ("pending", "available", "deleting")
ALIVE_VOLUME = ("creating", "available", "in-use")
ALIVE_ENDPOINT = ("pendingacceptance", "pending", "available", "deleting")


@dataclass(frozen=True)
class Billable:
    """One resource that costs money while it exists; hourly_usd None = price unknown."""
    kind: str  # instance | nat-gateway | load-balancer | ebs-volume | public-ipv4 | vpc-endpoint
    resource_id: str
    detail: str
    hourly_usd: float | None
    state: str = ""  # AWS's state word (running, available, deleting, in-use ...)

    def line(self) -> str:
        cost = "price unknown" if self.hourly_usd is None else f"${self.hourly_usd:.4f}/h"
        return f"{self.kind:14s} {self.resource_id:40s} {self.detail:32s} {cost}"


@dataclass(frozen=True)
class CostItem:
    """One priced line of a plan or month: `usd` per `per` (hour or month)."""
    name: str
    usd: float
    basis: str  # how it was computed, e.g. "0.045 USD/h x 1"


@lru_cache(maxsize=8)
def read_yaml(path: Path) -> Any:
    """A data file's YAML, read once per process (the files ship with the package)."""
    return yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def load_fixed_prices(region: str, path: Path | None = None) -> dict[str, float]:
    """Fixed prices of `region` from aws-fixed-prices.yaml as {key: usd} (units: see the file).

    Keys: nat_gateway_hour, nat_gateway_gb, alb_hour, alb_lcu_hour, ebs_gp3_gb_month,
    public_ipv4_hour, vpc_endpoint_az_hour, vpc_endpoint_gb, cloudwatch_logs_ingest_gb,
    data_transfer_out_gb. Raises KeyError naming the regions on file when `region` is absent.
    """
    doc = read_yaml(path or PRICES_PATH)
    regions = doc["regions"]
    if region not in regions:
        raise KeyError(f"no fixed AWS prices for region {region!r} in {path or PRICES_PATH}; "
                       f"on file: {', '.join(sorted(regions))}")
    return {key: float(entry["usd"]) for key, entry in regions[region].items()}


def hours_per_month(path: Path | None = None) -> float:
    """Hours in a billing month by AWS's convention (730), from the price file. Raises OSError, KeyError."""
    return float(read_yaml(path or PRICES_PATH)["hours_per_month"])


def stack_hourly_items(region: str, *, instance_hourly_usd: float | None, running: bool,
                       egress: str = "nat", root_volume_gib: float = 300, azs: int = 2,
                       alb_lcu: float = 1.0, prices: Mapping[str, float] | None = None) -> list[CostItem]:
    """USD per hour of the template's billable resources, idle (running=False) or running.

    Idle = the stack with the service at 0: NAT gateway + its public IPv4 (egress nat) or nine
    interface endpoints x `azs` (egress endpoints), the ALB at `alb_lcu` LCUs. Running adds
    one instance (`instance_hourly_usd`, caller's price; None leaves it out and says so in the
    item name) and its gp3 root volume of `root_volume_gib` GiB. Per-GB charges (NAT data,
    logs) are not hourly and are left to `monthly_breakdown`. Raises KeyError for an unknown
    region or egress.
    """
    p = dict(prices or load_fixed_prices(region))
    items: list[CostItem] = []
    if egress == "nat":
        items.append(CostItem("NAT gateway", p["nat_gateway_hour"], f"{p['nat_gateway_hour']} USD/h x 1"))
        items.append(CostItem("public IPv4 (NAT's Elastic IP)", p["public_ipv4_hour"],
                              f"{p['public_ipv4_hour']} USD/h x 1"))
    elif egress == "endpoints":
        n = len(INTERFACE_ENDPOINTS) * azs
        items.append(CostItem(f"interface VPC endpoints ({len(INTERFACE_ENDPOINTS)} x {azs} AZ)",
                              p["vpc_endpoint_az_hour"] * n, f"{p['vpc_endpoint_az_hour']} USD/AZ-h x {n}"))
    else:
        raise KeyError(f"egress must be 'nat' or 'endpoints', not {egress!r}")
    items.append(CostItem("internal ALB", p["alb_hour"], f"{p['alb_hour']} USD/h x 1"))
    items.append(CostItem(f"ALB LCUs ({alb_lcu:g})", p["alb_lcu_hour"] * alb_lcu,
                          f"{p['alb_lcu_hour']} USD/LCU-h x {alb_lcu:g}"))
    if running:
        gb_hour = p["ebs_gp3_gb_month"] / hours_per_month()
        items.append(CostItem(f"gp3 root volume ({root_volume_gib:g} GiB)", gb_hour * root_volume_gib,
                              f"{p['ebs_gp3_gb_month']} USD/GB-month / {hours_per_month():g} h x {root_volume_gib:g}"))
        if instance_hourly_usd is None:
            items.append(CostItem("GPU instance (price not given: left out)", 0.0, "unknown"))
        else:
            items.append(CostItem("GPU instance (On-Demand)", float(instance_hourly_usd),
                                  f"{instance_hourly_usd} USD/h x 1 (caller's price)"))
    return items


def monthly_breakdown(region: str, *, instance_hourly_usd: float, hours: float | None = None,
                      egress: str = "nat", root_volume_gib: float = 300, alb_lcu: float = 1.0,
                      nat_gb: float = 0.0, logs_gb: float = 0.0,
                      reference_monthly_usd: float | None = None) -> dict[str, Any]:
    """Itemised USD for `hours` (default 730) of the running stack, and the gap to a reference.

    Items: instance share, NAT gateway hours + `nat_gb` GB processed (or endpoints), public
    IPv4, ALB hours + LCUs, gp3 root volume (GB-month), CloudWatch Logs `logs_gb` GB.
    Returns {"items": [CostItem...] (USD for the period), "total_usd", "hours",
    "reference_usd", "unexplained_usd"} where unexplained_usd = reference - total (None
    without a reference): the published 8,887 USD/month for g7e.12xlarge (data/seed001.yaml)
    against ~6,049 for the instance alone leaves a remainder these fixed items do not cover.
    Raises KeyError for a region without fixed prices or an unknown egress.
    """
    p = load_fixed_prices(region)
    h = hours if hours is not None else hours_per_month()
    per_hour = stack_hourly_items(region, instance_hourly_usd=instance_hourly_usd, running=True,
                                  egress=egress, root_volume_gib=root_volume_gib, alb_lcu=alb_lcu, prices=p)
    items = [CostItem(i.name, i.usd * h, f"{i.basis} x {h:g} h") for i in per_hour]
    if egress == "nat" and nat_gb:
        items.append(CostItem(f"NAT data processed ({nat_gb:g} GB)", p["nat_gateway_gb"] * nat_gb,
                              f"{p['nat_gateway_gb']} USD/GB x {nat_gb:g}"))
    if egress == "endpoints" and nat_gb:
        items.append(CostItem(f"endpoint data processed ({nat_gb:g} GB)", p["vpc_endpoint_gb"] * nat_gb,
                              f"{p['vpc_endpoint_gb']} USD/GB x {nat_gb:g}"))
    if logs_gb:
        items.append(CostItem(f"CloudWatch Logs ingestion ({logs_gb:g} GB)",
                              p["cloudwatch_logs_ingest_gb"] * logs_gb,
                              f"{p['cloudwatch_logs_ingest_gb']} USD/GB x {logs_gb:g}"))
    total = sum(i.usd for i in items)
    return {"items": items, "total_usd": total, "hours": h, "reference_usd": reference_monthly_usd,
            "unexplained_usd": None if reference_monthly_usd is None else reference_monthly_usd - total}


# ---- the template, read without AWS (dry run)

class _CfnLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # libyaml when built with it
    """YAML loader that turns CloudFormation short forms (!Ref, !Sub ...) into {"Fn::X": ...}."""


def _cfn_tag(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> dict[str, Any]:
    value = (loader.construct_scalar(node) if isinstance(node, yaml.ScalarNode)
             else loader.construct_sequence(node, deep=True) if isinstance(node, yaml.SequenceNode)
             else loader.construct_mapping(node, deep=True))
    if suffix == "Ref":
        return {"Ref": value}
    if suffix == "GetAtt" and isinstance(value, str):
        value = value.split(".", 1)
    return {f"Fn::{suffix}": value}


_CfnLoader.add_multi_constructor("!", _cfn_tag)


def load_template(path: Path) -> dict[str, Any]:
    """The template as a dict (CloudFormation short-form tags expanded). Raises OSError/yaml errors."""
    return yaml.load(path.read_text(), Loader=_CfnLoader)


def template_resources(parameters: Mapping[str, Any], path: Path) -> tuple[list[tuple[str, str]], dict[str, Any]]:
    """(logical id, type) of the resources the template creates with `parameters`, and the
    parameter values with defaults filled in. Raises KeyError naming unknown parameters or a
    value outside a parameter's AllowedValues."""
    template = load_template(path)
    unknown = set(parameters) - set(template["Parameters"])
    if unknown:
        raise KeyError(f"unknown template parameter(s): {', '.join(sorted(unknown))}")
    values = {k: parameters.get(k, spec.get("Default")) for k, spec in template["Parameters"].items()}
    for k, spec in template["Parameters"].items():
        allowed = [str(a) for a in spec.get("AllowedValues", [])]
        if allowed and str(values[k]) not in allowed:
            raise KeyError(f"template parameter {k}={values[k]!r} is not one of {', '.join(allowed)}")
    conditions = {name: _condition_true(expr, values) for name, expr in template.get("Conditions", {}).items()}
    return ([(lid, r["Type"]) for lid, r in template["Resources"].items()
             if conditions.get(r.get("Condition"), True)], values)


def _condition_true(expr: Any, values: Mapping[str, Any]) -> bool:
    """Evaluates the template's Conditions (only Fn::Equals of a Ref and a literal is used)."""
    left, right = expr["Fn::Equals"]
    resolve = lambda v: str(values[v["Ref"]]) if isinstance(v, dict) else str(v)
    return resolve(left) == resolve(right)


def _tag_filter(stack_name: str) -> list[dict[str, Any]]:
    return [{"Name": f"tag:{TAG_STACK}", "Values": [stack_name]}]


def _pages(client: Any, op: str, key: str, **kwargs: Any) -> list[dict[str, Any]]:
    """All items of a paginated call; [] when ids given in kwargs are gone (*NotFound / *.NotFound)."""
    try:
        return [item for page in client.get_paginator(op).paginate(**kwargs) for item in page.get(key, [])]
    except client.exceptions.ClientError as e:
        if "NotFound" in e.response.get("Error", {}).get("Code", ""):
            return []
        raise


def _instances(ec2: Any, stack_name: str, instance_ids: Iterable[str]) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    queries = [{"Filters": _tag_filter(stack_name)}]
    ids = sorted(set(instance_ids))
    if ids:
        queries.append({"InstanceIds": ids})
    for q in queries:  # an id from the stack that is long gone gives InvalidInstanceID.NotFound: []
        for res in _pages(ec2, "describe_instances", "Reservations", **q):
            for inst in res["Instances"]:
                found[inst["InstanceId"]] = inst
    return found


def find_billable(session: Any, stack_name: str, *, physical_ids: Mapping[str, Iterable[str]] = {},
                  instance_hourly_usd: Mapping[str, float] | float | None = None) -> list[Billable]:
    """Every resource of the stack that bills now, each with its hourly USD.

    `physical_ids` maps CloudFormation types (AWS::EC2::NatGateway, AWS::EC2::EIP,
    AWS::ElasticLoadBalancingV2::LoadBalancer, AWS::EC2::VPCEndpoint, AWS::EC2::VPC) and
    "instances" to ids known from the stack; resources tagged servelab:stack=<stack_name> are
    found as well. `instance_hourly_usd`: one price for every instance, or {type: price}; an
    instance without a price gets hourly_usd None. Raises botocore errors (credentials,
    throttling) unchanged.
    """
    prices = load_fixed_prices(session.region_name)
    ec2 = session.client("ec2")
    ids = {k: set(v) for k, v in physical_ids.items()}
    instances = _instances(ec2, stack_name, ids.get("instances", ()))
    out, public_ips_of_instances = _billable_instances(instances, instance_hourly_usd)
    out += _billable_volumes(ec2, stack_name, instances, prices)
    nats, nat_ips = _billable_nat_gateways(ec2, stack_name, ids, prices)
    out += nats
    out += _billable_public_ips(ec2, stack_name, ids, nat_ips, public_ips_of_instances, prices)
    out += _billable_vpc_endpoints(ec2, stack_name, ids, prices)
    out += _billable_load_balancers(session.client("elbv2"), stack_name, ids, prices)
    return out


def _billable_instances(instances: Mapping[str, dict[str, Any]],
                        instance_hourly_usd: Mapping[str, float] | float | None) -> tuple[list[Billable], set[str]]:
    """The live instances (a stopped one at 0 USD/h) and the public IPv4 addresses they hold."""
    out: list[Billable] = []
    public_ips_of_instances: set[str] = set()
    for iid, inst in sorted(instances.items()):
        state = inst["State"]["Name"]
        if state not in ALIVE_INSTANCE:
            continue
        itype = inst["InstanceType"]
        price = (instance_hourly_usd.get(itype) if isinstance(instance_hourly_usd, Mapping)
                 else instance_hourly_usd)
        # a stopped instance bills no compute, only its volumes (listed below)
        out.append(Billable("instance", iid, f"{itype} {state}", 0.0 if state == "stopped" else price, state))
        if inst.get("PublicIpAddress"):
            public_ips_of_instances.add(inst["PublicIpAddress"])
    return out, public_ips_of_instances


def _billable_volumes(ec2: Any, stack_name: str, instances: Mapping[str, Any],
                      prices: Mapping[str, float]) -> list[Billable]:
    """The stack's EBS volumes and those attached to its instances."""
    out: list[Billable] = []
    gib_hour = prices["ebs_gp3_gb_month"] / hours_per_month()
    volumes: dict[str, dict[str, Any]] = {}
    queries = [{"Filters": _tag_filter(stack_name)}]
    if instances:
        queries.append({"Filters": [{"Name": "attachment.instance-id", "Values": sorted(instances)}]})
    for q in queries:
        for vol in _pages(ec2, "describe_volumes", "Volumes", **q):
            volumes[vol["VolumeId"]] = vol
    for vid, vol in sorted(volumes.items()):
        if vol["State"] in ALIVE_VOLUME:
            # gp3 price for every type: the template only makes gp3 (others differ a little)
            out.append(Billable("ebs-volume", vid, f"{vol.get('VolumeType')} {vol['Size']} GiB {vol['State']}",
                                gib_hour * vol["Size"], vol["State"]))
    return out


def _billable_nat_gateways(ec2: Any, stack_name: str, ids: Mapping[str, set[str]],
                           prices: Mapping[str, float]) -> tuple[list[Billable], set[str]]:
    """The stack's live NAT gateways and their public IPv4 addresses."""
    out: list[Billable] = []
    nats: dict[str, dict[str, Any]] = {}
    for q in ([{"Filters": _tag_filter(stack_name)}]
              + ([{"NatGatewayIds": sorted(ids["AWS::EC2::NatGateway"])}] if ids.get("AWS::EC2::NatGateway") else [])):
        for nat in _pages(ec2, "describe_nat_gateways", "NatGateways", **q):
            nats[nat["NatGatewayId"]] = nat
    nat_ips: set[str] = set()
    for nid, nat in sorted(nats.items()):
        if nat["State"] in ALIVE_NAT:
            out.append(Billable("nat-gateway", nid, nat["State"], prices["nat_gateway_hour"], nat["State"]))
            nat_ips |= {a.get("PublicIp") for a in nat.get("NatGatewayAddresses", []) if a.get("PublicIp")}
    return out, nat_ips


def _billable_public_ips(ec2: Any, stack_name: str, ids: Mapping[str, set[str]], nat_ips: set[str],
                         public_ips_of_instances: set[str], prices: Mapping[str, float]) -> list[Billable]:
    """The stack's Elastic IPs (its own, its NAT gateways') and its instances' other public IPv4s."""
    out: list[Billable] = []
    eips: dict[str, dict[str, Any]] = {}
    eip_ids = ids.get("AWS::EC2::EIP", set())
    for addr in ec2.describe_addresses()["Addresses"]:  # no paginator; one page per region
        tags = {t["Key"]: t["Value"] for t in addr.get("Tags", [])}
        if (tags.get(TAG_STACK) == stack_name or addr.get("PublicIp") in eip_ids
                or addr.get("AllocationId") in eip_ids or addr.get("PublicIp") in nat_ips):
            eips[addr.get("AllocationId") or addr["PublicIp"]] = addr
    for key, addr in sorted(eips.items()):
        out.append(Billable("public-ipv4", key, f"Elastic IP {addr['PublicIp']}", prices["public_ipv4_hour"]))
    for ip in sorted(public_ips_of_instances - {a["PublicIp"] for a in eips.values()}):
        out.append(Billable("public-ipv4", ip, "instance public IPv4", prices["public_ipv4_hour"]))
    return out


def _billable_vpc_endpoints(ec2: Any, stack_name: str, ids: Mapping[str, set[str]],
                            prices: Mapping[str, float]) -> list[Billable]:
    """The live interface endpoints of the stack or its VPC, priced per AZ."""
    out: list[Billable] = []
    endpoints: dict[str, dict[str, Any]] = {}
    vpcs = sorted(ids.get("AWS::EC2::VPC", ()))
    for q in ([{"Filters": _tag_filter(stack_name)}]
              + ([{"Filters": [{"Name": "vpc-id", "Values": vpcs}]}] if vpcs else [])):
        for ep in _pages(ec2, "describe_vpc_endpoints", "VpcEndpoints", **q):
            endpoints[ep["VpcEndpointId"]] = ep
    for eid, ep in sorted(endpoints.items()):
        if ep.get("VpcEndpointType") == "Interface" and ep["State"].lower() in ALIVE_ENDPOINT:
            azs = max(1, len(ep.get("SubnetIds", [])))
            out.append(Billable("vpc-endpoint", eid, f"{ep['ServiceName'].split('.')[-1]} x {azs} AZ",
                                prices["vpc_endpoint_az_hour"] * azs, ep["State"].lower()))
    return out


def _billable_load_balancers(elbv2: Any, stack_name: str, ids: Mapping[str, set[str]],
                             prices: Mapping[str, float]) -> list[Billable]:
    """The load balancers tagged with the stack or named by it (1 LCU assumed)."""
    out: list[Billable] = []
    lbs = {lb["LoadBalancerArn"]: lb for lb in _pages(elbv2, "describe_load_balancers", "LoadBalancers")}
    arns = sorted(lbs)
    tagged = set()
    for i in range(0, len(arns), 20):  # describe_tags takes at most 20 ARNs
        for desc in elbv2.describe_tags(ResourceArns=arns[i:i + 20])["TagDescriptions"]:
            if any(t["Key"] == TAG_STACK and t["Value"] == stack_name for t in desc.get("Tags", [])):
                tagged.add(desc["ResourceArn"])
    for arn in sorted(tagged | (set(ids.get("AWS::ElasticLoadBalancingV2::LoadBalancer", ())) & set(lbs))):
        lb = lbs[arn]
        out.append(Billable("load-balancer", lb["LoadBalancerName"], f"{lb['Type']} {lb['Scheme']}",
                            prices["alb_hour"] + prices["alb_lcu_hour"], lb["State"]["Code"]))  # 1 LCU assumed
    return out


def hourly_total_usd(items: Iterable[Billable]) -> float:
    """Sum of the known hourly prices in USD per hour; unknown prices count as 0. Raises nothing."""
    return sum(i.hourly_usd or 0.0 for i in items)


# ---- who else keeps the GPU pool busy (another service on the same compute pool blocks scaling it down)

def asg_instances(session: Any, asg_names: set[str]) -> set[str]:
    """Instance ids now in the named Auto Scaling groups (none named: empty). Raises botocore ClientError."""
    if not asg_names:
        return set()
    paginator = session.client("autoscaling").get_paginator("describe_auto_scaling_groups")
    return {i["InstanceId"] for page in paginator.paginate(AutoScalingGroupNames=sorted(asg_names))
            for g in page["AutoScalingGroups"] for i in g["Instances"]}


def uses_capacity(service: Mapping[str, Any], capacity_provider: str, cluster_default: list[str]) -> bool:
    """Whether an ECS service (describe_services shape) can place tasks on the capacity provider.

    True when its capacityProviderStrategy names it; with no strategy, when it is an EC2
    service (it lands on any registered instance of the cluster, ours included) or when the
    cluster's default strategy (`cluster_default`) names it. FARGATE services never do.
    Pure (no AWS call); raises KeyError only for a strategy entry without capacityProvider.
    """
    strategy = [s["capacityProvider"] for s in service.get("capacityProviderStrategy") or []]
    if strategy:
        return capacity_provider in strategy
    if service.get("launchType") in ("FARGATE", "EXTERNAL"):
        return False
    return service.get("launchType") == "EC2" or capacity_provider in cluster_default


def other_services_on(ecs: Any, capacity_providers: set[str], own_service_arns: set[str]) -> list[str]:
    """'cluster/service (desired N, running M)' of every other busy ECS service that can place
    tasks on `capacity_providers` (the shared GPU pool), skipping `own_service_arns`.
    Raises botocore ClientError."""
    found = []
    cluster_arns = [a for page in ecs.get_paginator("list_clusters").paginate() for a in page["clusterArns"]]
    for i in range(0, len(cluster_arns), 100):
        for cluster in ecs.describe_clusters(clusters=cluster_arns[i:i + 100])["clusters"]:
            ours = capacity_providers & set(cluster.get("capacityProviders", []))
            if not ours:
                continue
            default = [s["capacityProvider"] for s in cluster.get("defaultCapacityProviderStrategy", [])]
            arns = [a for page in ecs.get_paginator("list_services").paginate(cluster=cluster["clusterArn"])
                    for a in page["serviceArns"] if a not in own_service_arns]
            for j in range(0, len(arns), 10):  # describe_services takes 10 at most
                for svc in ecs.describe_services(cluster=cluster["clusterArn"], services=arns[j:j + 10])["services"]:
                    busy = svc.get("desiredCount", 0) > 0 or svc.get("runningCount", 0) > 0
                    if svc.get("status") == "ACTIVE" and busy and any(uses_capacity(svc, cp, default) for cp in ours):
                        found.append(f"{cluster['clusterName']}/{svc['serviceName']} (desired {svc['desiredCount']},"
                                     f" running {svc.get('runningCount', 0)})")
    return found
