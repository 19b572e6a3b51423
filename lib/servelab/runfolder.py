"""The run folder `runs/<study>/<config>/` and everything that reads or writes its files.

One place names the files (`RECORDS`, `RUN_JSON`, ...), writes JSON atomically and JSON lines
scrubbed of secrets and flushed per line (a killed run keeps every finished record), and
reads them back: run.json, engine.json, levels.jsonl and records.jsonl are written and read through
their types (`schema.runfiles`: a file of the wrong shape is one `RunFileError` naming it); `RunFolder` caches the records, their summary, the server samples and
run.json, so a write-up reads each raw file once. Also where the project lives
(`project_root`, `runs_root`, `reports_root`) and the one UTC timestamp format (`now_iso`).
Not for aggregation rules (`summary`) or the reproducibility record (`measure.runinfo`)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import cached_property
from pathlib import Path
from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd
from pydantic import ValidationError

from .errors import RunFileError
from .paths import project_root, reports_root, resolve, runs_root  # noqa: F401  (the run folder's roots)
from .secrets import scrub, secret_values
from .engines.prom import LIST_FIELDS, SAMPLE_FIELDS
from .schema.runfiles import DesignRecord, RequestRecord, RunInfo, check_line, versioned
from .summary import summarize

RECORDS = "records.jsonl"  # one line per request, appended as it ends
RUN_JSON = "run.json"  # the reproducibility record (status running -> complete | partial | failed)
SERVER_METRICS = "server_metrics.jsonl"  # /metrics samples tagged with the load level
GPU_METRICS = "gpu_metrics.jsonl"  # NVML samples of the engine's GPUs tagged with the load level
CLIENT_STATS = "client_stats.jsonl"  # the client's own event-loop lag and CPU per round
LEVELS = "levels.jsonl"  # a finished level: what --resume skips
ENGINE_JSON = "engine.json"  # the handle of the engine a stage left running
HOST_JSON = "host.json"  # what provisioning prepared
ENGINE_LOG = "engine.log"
PARAMS_EFFECTIVE = "params.effective.yaml"  # the study as validated for this run (--reduced, --url)
STUDY_JSON = "study.json"  # beside the configurations: the study as run, device sessions
QUALITY_JSON = "quality.json"  # the output check after the launch (measure.quality)
DESIGN_JSON = "design.json"  # beside the configurations: how they were measured (interleaved, budget, sampling)
VERDICTS_JSON = "verdicts.json"  # beside the configurations: each change's verdict per level (analysis.verdicts)
PREDICTION_JSON = "prediction.json"  # the performance model's prediction, written before the first request
HOST_PROBE_JSON = "host_probe.json"  # beside the configurations: the GPU host's CPU probe (measure.hostprobe)
PREDICTION_AFTER_JSON = "prediction-after.json"  # a later model's prediction of a published run, made after it
ROUTING_JSON = "routing.json"  # the engine's own routing report: distinct experts per decode step (servelab routing)
TUNE_JSON = "tune.json"  # beside the configurations: a `tune:` study's search, step by step (servelab.tune)
SPECULATIVE_JSONL = "speculative.jsonl"  # n-gram speculative decoding per prompt set (measure.realchecks)
# What a published report keeps of each configuration's run folder.
PUBLISHED_FILES = (RECORDS, RUN_JSON, SERVER_METRICS, GPU_METRICS, ENGINE_LOG, CLIENT_STATS, LEVELS, QUALITY_JSON,
                   PREDICTION_JSON, ROUTING_JSON)

# What a GPU study's real-weights checks leave in a configuration's folder (measure.realchecks),
# published beside (or instead of) the workload's files.
CHECK_FILES = (QUALITY_JSON, SPECULATIVE_JSONL)


def now_iso(timespec: str = "seconds") -> str:
    """Current UTC time as ISO 8601 (`timespec` as datetime.isoformat: seconds, milliseconds)."""
    return datetime.now(timezone.utc).isoformat(timespec=timespec)


class JsonlWriter:
    """Appends JSON lines; each line is flushed as it is written, so a killed run (Ctrl-C,
    SIGKILL, a crash) keeps it: the kernel holds the bytes once flushed. The file is fsynced
    on close; a per-line fsync (0.3 ms median, 3 ms p99 here) would sit on the client's event
    loop and distort the timing of requests in flight.

    `typed`: the typed file it writes (`RECORDS`, `LEVELS`): each line gets the file's `format_version`
    and is validated against its model before it is written (pydantic-core's compiled validator,
    ~5 us for a request record; the line itself is written as given)."""

    def __init__(self, path: Path, typed: str | None = None) -> None:
        self._secrets = secret_values()
        self._typed = typed
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(self.path, "a", encoding="utf-8")
        self.count = 0

    def write(self, rec: dict[str, Any] | RequestRecord, *, allow_nan: bool = True) -> None:
        """One line: a typed record as its `line()` (validated when it was built), a dict validated here."""
        if isinstance(rec, RequestRecord):
            rec = versioned(self._typed or RECORDS, rec.line())
        elif self._typed:
            rec = versioned(self._typed, rec)
            checked(self._typed, rec, f"a line for {self.path}")
        line = json.dumps(rec, separators=(",", ":"), default=str, allow_nan=allow_nan)
        self._f.write((scrub(line, self._secrets) if self._secrets else line) + "\n")
        self._f.flush()
        self.count += 1

    def close(self) -> None:
        if not self._f.closed:
            self._f.flush()
            os.fsync(self._f.fileno())
            self._f.close()

    def __enter__(self) -> "JsonlWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _lines(path: Path) -> Iterable[tuple[int, Any]]:
    """(line number, parsed line) of a JSON-lines file; a torn line (killed writer) is skipped."""
    path = Path(path)
    if not path.exists():
        return
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                yield n, json.loads(line)
            except json.JSONDecodeError:
                continue


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Read a JSON-lines file; a torn last line (killed writer) is skipped, not fatal."""
    return [obj for _, obj in _lines(path)]


def checked(name: str, data: Any, where: str) -> None:
    """Validate `data` as the typed run file `name` (`schema.runfiles.CURRENT`); a mismatch is one
    RunFileError naming `where` and the first key that is wrong."""
    try:
        check_line(name, data)
    except ValidationError as e:
        errs = e.errors()
        first = errs[0]
        loc = ".".join(str(x) for x in first["loc"]) or "the whole value"
        more = f" (and {len(errs) - 1} more)" if len(errs) > 1 else ""
        raise RunFileError(f"{where}: not a servelab {name}: {loc}: {first['msg']}, got "
                           f"{json.dumps(first.get('input'), default=str)[:80]}{more}") from None


def read_typed(path: Path, name: str | None = None) -> list[dict[str, Any]]:
    """A typed JSON-lines file's rows (records.jsonl, levels.jsonl; `name` defaults to the file's),
    each validated against its model, `format_version` dropped (a reader sees every version alike).
    A torn line is skipped as by `read_jsonl`; a line of the wrong shape raises RunFileError."""
    path, out = Path(path), []
    name = name or path.name
    for n, obj in _lines(path):
        checked(name, obj, f"{path} line {n}")
        obj.pop("format_version", None)
        out.append(obj)
    return out


def read_checked(path: Path, name: str | None = None) -> Any:
    """A typed JSON file (run.json, engine.json) as written, validated against its model."""
    path = Path(path)
    try:
        data = read_json(path)
    except ValueError as e:
        raise RunFileError(f"{path}: not JSON: {e}") from None
    checked(name or path.name, data, str(path))
    return data


def read_design(*dirs: Path) -> DesignRecord:
    """design.json from the first of `dirs` that holds one (a published study's data/, then its root);
    `DesignRecord()` (one at a time, no timings) for a study measured before the file existed."""
    for d in dirs:
        if (Path(d) / DESIGN_JSON).exists():
            return DesignRecord.model_validate(read_checked(Path(d) / DESIGN_JSON))
    return DesignRecord()


def write_design(root: Path, design: DesignRecord, *, update: bool = False) -> DesignRecord:
    """design.json beside a study's configurations; `update`: `design`'s fields set over the file's."""
    path = Path(root) / DESIGN_JSON
    full = design.model_dump(mode="json")  # a level's every field, its defaults too
    data = {k: v for k, v in full.items() if k in design.model_fields_set or k in (design.model_extra or {})}
    if update and path.exists():
        data = {**read_checked(path), **data}
    data = {"format_version": 1, **{k: v for k, v in data.items() if k != "format_version"}}
    write_json(path, data)
    return DesignRecord.model_validate(data)


def write_engine(path: Path, handle: dict[str, Any]) -> None:
    """engine.json, with its format_version, validated (`schema.runfiles.EngineHandle`)."""
    handle = versioned(ENGINE_JSON, handle)
    checked(ENGINE_JSON, handle, str(path))
    write_json(path, handle)


def read_engine(path: Path) -> dict[str, Any]:
    """engine.json (any version), validated."""
    return read_checked(path, ENGINE_JSON)


def mark_records(path: Path, marks: Mapping[tuple[int, int, int], str], name: str = "disturbed") -> int:
    """Set `name` to the reason on every record of `path` whose (level, round, attempt) is in
    `marks` (attempt 0 where a record has none); every other line is kept byte for byte, and the
    file is replaced atomically (no record is ever dropped). Returns the records marked."""
    path = Path(path)
    if not marks or not path.exists():
        return 0
    out, n = [], 0
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                rec = json.loads(line)
                key = (int(rec["level"]), int(rec["round"]), int(rec.get("attempt") or 0))
            except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                out.append(line)
                continue
            if key in marks:
                rec[name] = marks[key]
                line = json.dumps(rec, separators=(",", ":"), default=str) + "\n"
                n += 1
            out.append(line)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text("".join(out), encoding="utf-8")
    os.replace(tmp, path)
    return n


def load_records(run_dirs: Iterable[Path] | Path) -> pd.DataFrame:
    """All records of one or more run folders as one DataFrame (empty frame if none), each line
    validated (`schema.runfiles.RequestRecord`)."""
    if isinstance(run_dirs, (str, Path)):
        run_dirs = [Path(run_dirs)]
    rows: list[dict[str, Any]] = []
    for d in run_dirs:
        rows += read_typed(Path(d) / RECORDS)
    return pd.DataFrame(rows)


def write_json(path: Path, obj: Any) -> None:
    """Write JSON atomically (temp file + rename): a reader never sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(scrub(json.dumps(obj, indent=2, default=str, ensure_ascii=False)) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def read_json(path: Path) -> Any:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def load_samples(path: str | os.PathLike[str]) -> pd.DataFrame:
    """Read a sampler JSONL file into a DataFrame (one row per sample).

    ``{"available": false}`` lines are dropped; ``df.attrs["available"]`` is False
    (and ``df.attrs["reason"]`` set) when the file holds only such lines. A
    truncated/corrupt line (e.g. the last one after a crash) is skipped.
    ``wall_time`` becomes a UTC datetime column; missing metrics are NaN.
    """
    rows: list[dict[str, Any]] = []
    unavailable: dict[str, Any] | None = None
    for rec in read_jsonl(Path(path)):
        if rec.get("available") is False:
            unavailable = rec
            continue
        rows.append(rec)
    numeric = [f for f in SAMPLE_FIELDS if f != "engine" and f not in LIST_FIELDS] + ["t_s", "scrape_latency_s"]
    base_cols = ["t_s", "wall_time", "level", *SAMPLE_FIELDS, "scrape_latency_s"]
    df = pd.DataFrame(rows)
    for c in base_cols:
        if c not in df.columns:
            df[c] = pd.Series(dtype="object")
    df = df[base_cols + [c for c in df.columns if c not in base_cols]]
    for c in numeric:
        df[c] = pd.to_numeric(df[c], errors="coerce").astype("float64")
    df["wall_time"] = pd.to_datetime(df["wall_time"], utc=True, format="ISO8601")
    df.attrs["available"] = not (unavailable is not None and not rows)
    if unavailable is not None:
        df.attrs["reason"] = unavailable.get("reason")
    return df


@dataclass
class RunFolder:
    """One configuration's run folder, read lazily and once: records, their summary, the
    server and GPU samples, run.json and the other files by name. Writers go through
    `write_run` / `writer(name)` so every file is scrubbed and named in one place.

    run.json and the study's study.json (one folder up) carry `format_version`
    (`schema.FORMAT_VERSION`, now 3) as their first key; a file without it was written by
    servelab 0.1 (format 1: what `schema.upgrade` converts) and is still read. records.jsonl,
    levels.jsonl and engine.json lines carry `schema.runfiles.LINE_FORMAT` (2; 1: no key). `run`,
    `levels` and `records` are validated as read; `info` is run.json typed (`RunInfo`)."""

    path: Path
    _cache: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.path = Path(self.path)

    def __truediv__(self, name: str) -> Path:
        return self.path / name

    @property
    def name(self) -> str:
        return self.path.name

    def exists(self, name: str = RECORDS) -> bool:
        return (self.path / name).exists()

    @cached_property
    def records(self) -> pd.DataFrame:
        """records.jsonl as a frame: a column per key the lines carry (`RequestRecord`'s fields, a source's own)."""
        return load_records(self.path)

    def request_records(self) -> list[RequestRecord]:
        """records.jsonl as typed rows, every format version alike."""
        return [RequestRecord.model_validate(d) for d in read_typed(self.path / RECORDS)]

    @cached_property
    def summary(self) -> pd.DataFrame:
        return summarize(self.records, self.levels)

    @cached_property
    def levels(self) -> list[dict[str, Any]]:
        """levels.jsonl rows (finished levels, with the engine's counters over their measured
        rounds), each tagged with this run's configuration id."""
        cfg = str(self.records["config"].iloc[0]) if "config" in self.records else self.path.name
        return [{**r, "config": cfg} for r in read_typed(self.path / LEVELS)]

    @cached_property
    def samples(self) -> pd.DataFrame | None:
        return load_samples(self.path / SERVER_METRICS) if self.exists(SERVER_METRICS) else None

    @cached_property
    def gpu_samples(self) -> pd.DataFrame | None:
        if not self.exists(GPU_METRICS):
            return None
        rows = read_jsonl(self.path / GPU_METRICS)
        return pd.DataFrame(rows) if rows else None

    @cached_property
    def run(self) -> dict[str, Any]:
        """run.json as written (validated: `RunInfo`), {} where there is none."""
        return read_checked(self.path / RUN_JSON) if self.exists(RUN_JSON) else {}

    @cached_property
    def info(self) -> RunInfo:
        """run.json typed: `info.server.version`, `info.engine_kind`, `info.facts` (empty where none)."""
        return RunInfo.model_validate(self.run)

    @cached_property
    def prediction(self) -> dict[str, Any]:
        """prediction.json (written before the first request), else run.json's stored `prediction`
        of an older run, else {}."""
        if self.exists(PREDICTION_JSON):
            return read_json(self.path / PREDICTION_JSON)
        return self.run.get("prediction") or {}

    @cached_property
    def prediction_after(self) -> dict[str, Any]:
        """prediction-after.json: a later model's prediction of this run, made after it was measured and labelled
        so (`benchmarks/prediction_errors.py --after`); {} where there is none."""
        return read_json(self.path / PREDICTION_AFTER_JSON) if self.exists(PREDICTION_AFTER_JSON) else {}

    def jsonl(self, name: str) -> list[dict[str, Any]]:
        return read_jsonl(self.path / name)

    def json(self, name: str) -> Any:
        return read_json(self.path / name)

    def write_run(self, record: dict[str, Any]) -> None:
        data = versioned(RUN_JSON, record)
        checked(RUN_JSON, data, str(self.path / RUN_JSON))
        write_json(self.path / RUN_JSON, data)
        self.__dict__.pop("run", None)
        self.__dict__.pop("info", None)

    def writer(self, name: str) -> JsonlWriter:
        """The file's writer; records.jsonl and levels.jsonl lines are validated and versioned."""
        return JsonlWriter(self.path / name, typed=name if name in (RECORDS, LEVELS) else None)

    def invalidate(self) -> None:
        """Forget what was read (after the run appended records)."""
        for k in ("records", "summary", "samples", "gpu_samples", "run", "info"):
            self.__dict__.pop(k, None)
