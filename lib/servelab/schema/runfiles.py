"""The run folder's files as types: run.json (`RunInfo`), engine.json (`EngineHandle`), a line of
levels.jsonl (`LevelSummary`) and a line of records.jsonl (`RequestRecord`).

Unlike the params models these allow unknown keys (`extra="allow"`): a file keeps every key it was
written with, older files lack keys added since and newer ones may carry keys this code does not
know; the keys readers rely on are typed here, and a file whose value has the wrong type is refused.
Each file carries `format_version`; a file without one is version 1 (records, levels and engine.json
before this module; run.json's own history is `schema.FORMAT_VERSION`'s). The writers
(`runfolder.RunFolder.write_run`, `RunFolder.writer`, `runfolder.write_engine`) validate through
these models and write the dict as given, so the bytes on disk are what they were, plus the version.
`check_line` is the hot path's validator (pydantic-core's compiled validator: ~5 us per request record).
Nothing here reads or writes a file (`runfolder`)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from . import FORMAT_VERSION

#: the format of records.jsonl, levels.jsonl and engine.json lines this code writes (1: no key)
LINE_FORMAT = 2

Number = float | None


class Open(BaseModel):
    """A run file's part: typed where readers rely on it, every other key kept."""

    model_config = ConfigDict(extra="allow")


# -- records.jsonl --------------------------------------------------------------------------------

def _peer(default: Any = ..., **kw: Any) -> Any:
    """A field every importer of another tool's results fills (`RequestRecord.peer_columns`)."""
    return Field(default, json_schema_extra={"peer": True}, **kw)


class RequestOutcome(Open):
    """What the client measured of one request (`measure.client.send`): built at the send, filled as
    the stream ends, every failure classified (`error_kind`), never raised. Times in seconds; `start_s`
    and `end_s` on the client's perf_counter clock (the same for every request of a run), `ttft_s`,
    `e2e_s` and `chunk_times_s` relative to `start_s`. The rates come from `with_rates`."""

    ok: bool = _peer(False)
    error_kind: str | None = _peer(None)
    error_detail: str | None = _peer(None)
    http_status: int | None = None
    start_s: float = _peer(0.0)
    sent_unix_s: float | None = None  # the wall clock at send (UTC seconds): orders a request against other files
    end_s: float = _peer(0.0)
    ttft_s: Number = _peer(None)
    e2e_s: Number = _peer(None)
    prompt_tokens: int | None = _peer(None)
    output_tokens: int | None = _peer(None)
    cached_tokens: int | None = None
    n_chunks: int = 0
    n_text_chunks: int = 0
    chunk_times_s: list[float] = _peer(default_factory=list)  # offsets of text chunks from start
    # usage.completion_tokens as each text chunk arrived (stream_options.continuous_usage_stats): how many
    # tokens a chunk carried (several with speculative decoding); empty when the server did not say
    chunk_tokens: list[int] = Field(default_factory=list)
    finish_reason: str | None = None
    output_chars: int = 0
    server_chunk_ns: list[int] = Field(default_factory=list)  # emission stamps (reference server only)
    server_due_ns: list[int] = Field(default_factory=list)  # their scheduled times (reference server only)
    content_ttft_s: Number = None  # first chunk carrying answer content (after any reasoning)
    reasoning_chunks: int = 0  # chunks carrying reasoning_content / reasoning (a separate channel)
    reasoning_tokens: int | None = None  # usage.completion_tokens_details.reasoning_tokens, when given
    output_tokens_source: str | None = None  # "server" (usage) or "client" (counted with the tokenizer)
    # the answer's content when the request asked to keep it; all generated text when the stream carried no usage
    output_text: str | None = None
    # the answer's token ids when the server streams them (vLLM's return_token_ids)
    output_token_ids: list[int] | None = None
    decode_tps: Number = _peer(None)  # (output_tokens - 1) / (e2e_s - ttft_s)
    e2e_output_tps: Number = _peer(None)  # output_tokens / e2e_s
    tpot_s: Number = _peer(None)  # 1 / decode_tps

    def with_rates(self) -> "RequestOutcome":
        """This outcome with its three rates set from its tokens and times (None unless ok)."""
        ok, n, e2e = self.ok, self.output_tokens, self.e2e_s
        dt = (e2e or 0) - (self.ttft_s or 0)
        self.decode_tps = (n - 1) / dt if ok and n is not None and n >= 2 and dt > 0 else None
        self.e2e_output_tps = n / e2e if ok and n and e2e else None
        self.tpot_s = 1.0 / self.decode_tps if self.decode_tps else None
        return self


# -- records.jsonl --------------------------------------------------------------------------------

class RequestRecord(RequestOutcome):
    """One request as records.jsonl holds it: the client's outcome and where it ran (the runner's level,
    round and send schedule, `measure.runner.LevelRunner.record`; the source's keys). An imported run's
    records have the `peer_columns`."""

    format_version: int = 1
    study: str | None = None
    config: str = _peer()
    level: int
    bucket: str = _peer()
    target_input_tokens: int = _peer(0)
    target_output_tokens: int = _peer(0)
    shared_prefix: bool | None = None
    concurrency: int = _peer()
    rate_rps: float = _peer(0.0)
    arrival: str | None = None
    round: int = _peer()
    warmup: bool = _peer()
    attempt: int = 0  # > 0: the round measured again after a disturbance (measure.interleave)
    disturbed: str | None = None  # why this attempt of the round is left out (kept, never deleted)
    seq: int = _peer()
    cache_salt: str | None = None
    scheduled_s: Number = None
    send_lag_s: Number = None
    source: str | None = None  # the workload source that drafted it (measure.sources)
    prompt_set: str | None = None
    prompt_id: str | None = None
    canary: bool | None = None  # a quality prompt sent inside the load (its level's warm-up round): never in a result
    tool: str | None = _peer(None)  # the other tool whose result file it was imported from
    times_reconstructed: bool | None = _peer(None)

    @classmethod
    def peer_columns(cls) -> list[str]:
        """The columns every importer of another tool's results fills, so `summary.summarize` works on any."""
        peer = [k for k, f in cls.model_fields.items() if (f.json_schema_extra or {}).get("peer")]
        return [k for k in peer if k in _WHERE] + [k for k in peer if k not in _WHERE]

    def line(self) -> dict[str, Any]:
        """The line records.jsonl gets: the keys set, where it ran first, then the outcome, then the source's
        own keys (a session's id, a trace's index)."""
        d = self.model_dump(exclude_unset=True)
        head = [k for k in _WHERE if k in d]
        return {**{k: d[k] for k in head}, **{k: v for k, v in d.items() if k not in _WHERE}}


_WHERE = [k for k in RequestRecord.model_fields if k not in RequestOutcome.model_fields]


# -- levels.jsonl ---------------------------------------------------------------------------------

class LevelSampling(Open):
    """How an interleaved level's sampling ended (`measure.interleave`)."""

    stopped: str
    measured_rounds: int


class LevelSummary(Open):
    """A finished level (what --resume skips), with the engine's counters over its measured rounds."""

    format_version: int = 1
    level: int
    label: str
    status: str
    sent: int
    failed: int
    prefix_cache_queries: Number = None
    prefix_cache_hits: Number = None
    measured_s: Number = None
    counters: dict[str, float | list[float] | None] | None = None
    sampling: LevelSampling | None = None
    rounds: int | None = None
    imported: bool | None = None
    disturbed: list[dict[str, Any]] | None = None  # the level's disturbed rounds (measure.interleave)
    remeasured: int | None = None  # rounds measured again at this level
    warming_ttft_s: list[float] | None = None  # a first pass still warming up, measured again (`measure.runner`)


# -- engine.json ----------------------------------------------------------------------------------

class EngineHandle(Open):
    """The engine a launch left running (`hosts.*.launch`): where to reach it and what it is."""

    format_version: int = 1
    mode: str | None = None
    base_url: str
    model: str
    pid: int | None = None
    tunnel_pid: int | None = None
    tokenizer_dir: str | None = None
    info: dict[str, Any] = Field(default_factory=dict)


# -- run.json -------------------------------------------------------------------------------------

class ServelabInfo(Open):
    version: str | None = None
    commit: str | None = None
    dirty: bool | None = None
    package_sha256: str | None = None


class ClientHost(Open):
    cpu_model: str | None = None
    cpu_count: int | None = None
    python: str | None = None
    gpus: list[dict[str, Any]] = Field(default_factory=list)


class ServerInfo(Open):
    """The engine as the run found it (the handle's `info`): version, launch command, start-up time."""

    mode: str | None = None
    version: str | None = None
    base_url: str | None = None
    pid: int | None = None
    command: list[str] | None = None
    env: dict[str, Any] | None = None
    startup_s: Number = None
    peak_rss_bytes: int | None = None


class EngineRecord(Open):
    """The engine set-up that launched (`schema.EngineParams` as dumped; older keys kept)."""

    kind: str | None = None
    load_format: str | None = None
    args: dict[str, Any] = Field(default_factory=dict)
    env: dict[str, Any] = Field(default_factory=dict)


class ModelRecord(Open):
    path: str | None = None
    revision: str | None = None
    config: dict[str, Any] | None = None
    facts: dict[str, Any] | None = None


class Headline(Open):
    sent: int | None = None
    ok: int | None = None
    success_rate: Number = None
    max_aggregate_output_tps: Number = None


class RunInfo(Open):
    """run.json: what ran, on what, and how it ended (status running -> complete | partial | failed).
    No key is required: a run.json is written at a run's start with few of them, and a stage that died
    leaves what it had."""

    format_version: int = 1
    study: str | None = None
    config: str | None = None
    status: str | None = None
    message: str = ""
    started_at: str | None = None
    finished_at: str | None = None
    measured_from: str | None = None
    records: int | None = None
    servelab: ServelabInfo = Field(default_factory=ServelabInfo)
    client_host: ClientHost = Field(default_factory=ClientHost)
    packages: dict[str, str] = Field(default_factory=dict)
    server: ServerInfo = Field(default_factory=ServerInfo)
    model_name: str | None = None
    workload: dict[str, Any] = Field(default_factory=dict)
    calibration: dict[str, Any] = Field(default_factory=dict)
    headline: Headline = Field(default_factory=Headline)
    client_limited_levels: list[dict[str, Any]] = Field(default_factory=list)
    configuration: dict[str, Any] | None = None
    engine_params: EngineRecord | None = None
    #: the parallel layout (TP, PP, DP, EP, gpus, label), its communication flags and NCCL_* environment
    layout: dict[str, Any] | None = None
    model: ModelRecord | None = None
    gpus_used: list[dict[str, Any]] | None = None
    hardware_measured: dict[str, Any] | None = None
    host_probe: dict[str, Any] | None = None  # a GPU host's CPU: its eager kernel launch (measure.hostprobe)
    prediction_file: str | None = None
    prediction: dict[str, Any] | None = None
    prediction_error: str | None = None
    capacity: dict[str, Any] | None = None
    imported: dict[str, Any] | None = None

    @property
    def engine_kind(self) -> str | None:
        return self.engine_params.kind if self.engine_params else None

    @property
    def load_format(self) -> str | None:
        return self.engine_params.load_format if self.engine_params else None

    @property
    def facts(self) -> dict[str, Any]:
        return (self.model.facts if self.model else None) or {}


# -- design.json ----------------------------------------------------------------------------------

class SampledLevel(Open):
    """How one level of an interleaved benchmark was sampled (`measure.interleave`): measured rounds per
    start (with a kept attempt), why it stopped ("settled" | "max_rounds" | "budget" | "fixed"), its
    time (`warmup_s` of it on the warm-up rounds), and its disturbed rounds: how many, measured again,
    the seconds spent measuring again and waiting for the machine to be quiet, and when."""

    label: str
    rounds: dict[str, int] = Field(default_factory=dict)
    stopped: str = "fixed"
    seconds: float = 0.0
    note: str = ""
    warmup_s: float = 0.0
    disturbed: int = 0
    remeasured: int = 0
    remeasure_s: float = 0.0
    waited_s: float = 0.0
    borrowed_s: float = 0.0  # rounds past the level's share of the budget (comparisons above the aim)
    credited_s: float = 0.0  # of `waited_s`, what did not count against the budget (measure.interleave.WAIT_CREDIT_S)
    windows: list[dict[str, Any]] = Field(default_factory=list)


class LaunchTimes(Open):
    """The side-by-side launch: its wall time and each configuration's start-up."""

    wall_s: float = 0.0
    per_config_s: dict[str, float] = Field(default_factory=dict)
    spans: dict[str, list[float]] = Field(default_factory=dict)  # config -> [from, to] (unix): its start-up
    #: stretches in which other processes took the CPU (measure.machine.LaunchWatch.windows)
    windows: list[dict[str, Any]] = Field(default_factory=list)


class DesignRecord(Open):
    """design.json beside a study's configurations: how they were measured. Side by side and interleaved
    (`interleaved`, the lanes, the launch, the time budget, the MDE target, the rounds, each level's
    sampling) or one at a time (`reason`: why not side by side). A study measured before this file
    existed reads as `DesignRecord()`: one at a time, no timings."""

    format_version: int = 1
    interleaved: bool = False
    reason: str | None = None
    lanes: int | None = None
    memory: str | None = None  # why the engines fit side by side
    launch: LaunchTimes | None = None
    order: list[str] = Field(default_factory=list)
    started_at: str | None = None
    benchmark_s: Number = None
    # "mde-borrow-then-budget": to the aim (past a level's share on time the later levels lend: measure.interleave.BORROW),
    # then towards the finer aim while the level's share lasts; "mde-then-budget": the same without borrowing;
    # "mde": stopped at the aim; None: before 2026-12-05, a clear interim verdict stopped a comparison too
    sampling_rule: str | None = None
    quality_s: Number = None  # the quality checks before the rounds, wall time (engines checked two at a time)
    budget_s: Number = None
    mde_target: Number = None
    max_rounds: int | None = None
    first_rounds: int | None = None
    left_s: Number = None
    levels: list[SampledLevel] = Field(default_factory=list)
    status: dict[str, str] = Field(default_factory=dict)
    # on GPUs (servelab.placement.Placement.record): the machine, each server's GPUs, port, configurations and
    # memory, the lanes and groups, and each server's start-up seconds
    placement: dict[str, Any] | None = None


#: the model of each typed file (by its name in the run folder), with the version it is written in
CURRENT = {"run.json": (RunInfo, FORMAT_VERSION), "engine.json": (EngineHandle, LINE_FORMAT),
           "levels.jsonl": (LevelSummary, LINE_FORMAT), "records.jsonl": (RequestRecord, LINE_FORMAT),
           "design.json": (DesignRecord, 1)}

def check_line(name: str, data: dict[str, Any]) -> None:
    """Validate one file's (or line's) content against its model; raises pydantic's ValidationError.
    The instance is dropped: a writer writes `data` as given, a reader keeps the dict."""
    CURRENT[name][0].model_validate(data)


def versioned(name: str, data: dict[str, Any]) -> dict[str, Any]:
    """`data` with the file's current `format_version` as its first key."""
    return {"format_version": CURRENT[name][1], **data}


__all__ = ["RequestOutcome", "RequestRecord", "DesignRecord", "SampledLevel", "LaunchTimes", "LevelSummary", "LevelSampling", "EngineHandle", "RunInfo", "ServelabInfo",
           "ClientHost", "ServerInfo", "EngineRecord", "ModelRecord", "Headline", "LINE_FORMAT", "CURRENT",
           "check_line", "versioned"]
