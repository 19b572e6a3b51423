"""Result files of other benchmark tools: which tool wrote a file (`detect`), and the file read as
runs (`read`): one `Source` per run of the tool in it (an AIPerf export, a GuideLLM benchmark, a
`vllm bench serve` result object, an SGLang bench_serving line), each with servelab's records of its
requests (analysis.peers, analysis.sglang_bench, analysis.aiperf), the tool's own figures in
servelab's units, the tool's summary as it wrote it (per-request lists left out), the format it was
recognised by (`schema`: each version's own markers), the requests the tool counted, and its
measurement window (requests outside it are kept and flagged `excluded`).

Formats read (`SCHEMAS`): AIPerf's profile_export.jsonl in the 0.1.x record schema (tags `ttft`,
metadata `timestamp_ns`) and the later one (`request_start_ns`); GuideLLM's report of 0.2-0.3
(`run_stats`), 0.4, v1 (0.5-0.6) and v2 (0.7-0.8), JSON or YAML; `vllm bench serve --save-detailed`
JSON (or JSON lines of `--append-result`); SGLang `bench_serving --output-details` JSONL.

A file that is none of these raises `ImportFormatError`: one line naming the file and what to pass
instead (a summary or CSV without per-request data: the per-request file beside it; a servelab run
folder: `servelab compare`). Not for writing run folders (`results.importer`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from ..analysis import aiperf as ap
from ..analysis.harmonise import drop_role_chunk
from ..analysis.peers import guidellm_rows, guidellm_window, vllm_bench_reported, vllm_bench_rows
from ..analysis.sglang_bench import sglang_bench_reported, sglang_bench_rows
from ..errors import UserError
from ..runfolder import RECORDS, RUN_JSON
from ..schema.runfiles import RequestRecord

TOOLS = ("aiperf", "guidellm", "vllm-bench", "sglang-bench")
EXPECTED = ("AIPerf profile_export.jsonl (0.1-0.13, or its artifact folder), GuideLLM benchmarks.json/.yaml "
            "(0.2-0.8), `vllm bench serve --save-result --save-detailed` JSON, SGLang bench_serving "
            "--output-details JSONL")
WANT = {"aiperf": "an AIPerf profile_export.jsonl (0.1-0.13, or its artifact folder)",
        "guidellm": "a GuideLLM benchmarks.json/.yaml report (0.2-0.8)",
        "vllm-bench": "a `vllm bench serve --save-result --save-detailed` JSON",
        "sglang-bench": "an SGLang bench_serving --output-details JSONL"}
PER_REQUEST_LISTS = ("ttfts", "itls", "input_lens", "output_lens", "latencies", "start_times", "errors",
                     "generated_texts", "queue_times")
#: the format each reader recognises, by the markers it is told by
SCHEMAS = {
    "aiperf-0.1": "AIPerf 0.1.x export (metric tags ttft/ttst, metadata timestamp_ns; the summary states no version)",
    "aiperf-0.2": "AIPerf 0.2+ export (metadata request_start_ns / benchmark_phase)",
    "guidellm-0.3": "GuideLLM 0.2-0.3 report (run_stats, request_totals on the benchmark; no metadata)",
    "guidellm-0.4": "GuideLLM 0.4 report (scheduler_metrics; no metadata)",
    "guidellm-v1": "GuideLLM report v1 (0.5-0.6: metadata.version 1)",
    "guidellm-v2": "GuideLLM report v2 (0.7-0.8: metadata.version 2)",
    "vllm-bench": "vllm bench serve result with per-request lists (--save-detailed)",
    "sglang-bench": "SGLang bench_serving line with per-request lists (--output-details)",
}


class ImportFormatError(UserError, ValueError):
    """The file is not a result servelab can import: exit 2, nothing written."""


@dataclass
class Source:
    """One run of a tool read from a file: its requests as servelab records, its own figures, the
    format it was recognised by, the requests it counted and its measurement window."""

    tool: str
    version: str | None  # as the file states it (None: it does not)
    path: Path
    rows: list[dict[str, Any]]
    reported: dict[str, Any] = field(default_factory=dict)  # the tool's figures, servelab units
    summary: dict[str, Any] = field(default_factory=dict)  # the tool's summary as written (no per-request lists)
    settings: dict[str, Any] = field(default_factory=dict)  # model, url, concurrency as the tool recorded them
    schema: str = ""  # a key of SCHEMAS
    counted: int | None = None  # requests the tool counted in its window (None: it does not say)
    window: list[float] | None = None  # its measurement window [start, end] (wall clock s) where it stores more
    window_rule: str = "every request"  # how the tool drew its window, in words

    @property
    def level(self) -> tuple[str, int]:
        r = self.rows[0]
        return str(r["bucket"]), int(r["concurrency"])

    @property
    def measured(self) -> int:
        """The stored requests inside the tool's window."""
        return sum(1 for r in self.rows if not r.get("excluded"))

    @property
    def excluded(self) -> dict[str, int]:
        """Stored requests the tool left out of its figures, by why."""
        out: dict[str, int] = {}
        for r in self.rows:
            if r.get("excluded"):
                out[r["excluded"]] = out.get(r["excluded"], 0) + 1
        return out

    @property
    def sampled(self) -> bool:
        """The file stores fewer requests of the window than the tool counted (a sampled report)."""
        return self.counted is not None and self.measured < self.counted

    def describe(self) -> dict[str, Any]:
        """What run.json's `imported` says of this run: format, window, sample."""
        return {"file": self.path.name, "schema": self.schema, "schema_text": SCHEMAS.get(self.schema, ""),
                "version": self.version, "stored": len(self.rows), "measured": self.measured,
                "excluded": self.excluded, "counted": self.counted, "sampled": self.sampled,
                "window": self.window, "window_rule": self.window_rule}


def _fail(path: Path, why: str, tool: str | None = None) -> ImportFormatError:
    expected = WANT[tool] if tool else f"one of: {EXPECTED}"
    return ImportFormatError(f"{path}: {why}; expected {expected}")


def _refuse(path: Path, why: str) -> ImportFormatError:
    """A file servelab knows but cannot import: one line saying what to pass instead."""
    return ImportFormatError(f"{path}: {why}")


def _beside(p: Path, name: str) -> str:
    q = p.with_name(name)
    return f"import {q} beside it" if q.exists() else f"import the {name} AIPerf wrote beside it"


def _csv(path: Path, text: str) -> ImportFormatError:
    head = text.lstrip().splitlines()[0] if text.strip() else ""
    if head.startswith("Metric,"):
        return _refuse(path, "an AIPerf CSV summary (profile_export_aiperf.csv) holds no per-request data: "
                             + _beside(path, "profile_export.jsonl"))
    if "Run Info" in head or "Benchmark" in head:
        return _refuse(path, "a GuideLLM CSV summary holds no per-request data: import its JSON or YAML report "
                             "(guidellm --output kind=json)")
    return _refuse(path, f"a CSV table, not a per-request result; servelab imports {EXPECTED}")


def _run_folder(p: Path) -> ImportFormatError:
    return _refuse(p, "a servelab run folder: it needs no import; compare it with another run or study with "
                      "`servelab compare A B`")


def parse_file(path: Path) -> tuple[str, Any]:
    """("json", object) | ("jsonl", [objects]) | ("yaml", object); ImportFormatError otherwise."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise _fail(path, "not a text file") from None
    if not text.strip():
        raise _fail(path, "empty file")
    if path.suffix.lower() in (".csv", ".tsv"):
        raise _csv(path, text)
    try:
        return "json", json.loads(text)
    except json.JSONDecodeError as e:
        whole = e
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if len(lines) > 1 and lines[0].lstrip().startswith("{"):
        objs = []
        for n, ln in enumerate(lines, 1):
            try:
                objs.append(json.loads(ln))
            except json.JSONDecodeError as e:
                raise _fail(path, f"line {n} of {len(lines)} is not JSON ({e.msg}): truncated?") from None
        return "jsonl", objs
    if path.suffix in (".yaml", ".yml"):
        try:
            return "yaml", yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise _fail(path, f"not valid YAML ({str(e).splitlines()[0]})") from None
    if "," in lines[0] and not lines[0].lstrip().startswith(("{", "[")):
        raise _csv(path, text)
    raise _fail(path, f"not valid JSON ({whole.msg} at line {whole.lineno} column {whole.colno}): truncated?")


def _is_servelab_record(obj: Any) -> bool:
    return isinstance(obj, dict) and {"config", "level", "bucket", "ok", "round"} <= set(obj)


def _kind_of(obj: Any) -> str | None:
    if ap.is_record(obj):
        return "aiperf"
    if ap.is_summary(obj):
        return "aiperf-summary"
    if isinstance(obj, dict) and isinstance(obj.get("benchmarks"), list) and (
            "guidellm_version" in (obj.get("metadata") or {})
            or any(isinstance(b, dict) and str(b.get("type_", "")).startswith("generative") for b in obj["benchmarks"])):
        return "guidellm"
    if isinstance(obj, dict) and ("median_e2el_ms" in obj or "model_id" in obj or "endpoint_type" in obj):
        return "vllm-bench"
    if isinstance(obj, dict) and ("median_e2e_latency_ms" in obj or "server_info" in obj or "dataset_name" in obj):
        return "sglang-bench"
    if _is_servelab_record(obj) or (isinstance(obj, dict) and "study" in obj and "format_version" in obj
                                    and ("engine_params" in obj or "headline" in obj or "imported" in obj)):
        return "servelab"
    return None


def detect(path: Path | str) -> str:
    """The tool that wrote `path` (one of TOOLS); ImportFormatError if none did."""
    return read(path)[0].tool


def _folder(d: Path) -> Path:
    """The file to import from a folder: AIPerf's export in its artifact folder; a servelab run or
    study folder is refused, pointing at `servelab compare`."""
    if (d / RECORDS).exists() or (d / RUN_JSON).exists() or (d / "data").is_dir() or any(d.glob(f"*/{RECORDS}")):
        raise _run_folder(d)
    hits = sorted(d.glob("*profile_export.jsonl"))
    if not hits:
        raise _fail(d, "a folder without a profile_export.jsonl (AIPerf's artifact folder) in it")
    return hits[0]


def _strip(obj: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in PER_REQUEST_LISTS}


def _read_aiperf(p: Path, objs: list[Any], config: str, bucket: str | None) -> list[Source]:
    if not all(ap.is_record(o) for o in objs):
        raise _fail(p, "some lines are not AIPerf request records", "aiperf")
    schema = "aiperf-0.1" if ap.record_schema(objs[0]) == ap.OLD else "aiperf-0.2"
    sp = p.with_name(p.name.replace("profile_export.jsonl", ap.SUMMARY_NAME))
    summary = json.loads(sp.read_text(encoding="utf-8")) if sp.exists() and sp != p else None
    if summary is not None and not ap.is_summary(summary):
        summary = None
    rows = ap.aiperf_rows(objs, config=config, summary=summary, bucket_label=bucket)
    settings = ap.summary_settings(summary)
    if summary is not None and settings.get("streaming") is False:
        raise _fail(p, "AIPerf ran without --streaming: no TTFT or chunk times to recompute", "aiperf")
    return [Source("aiperf", (summary or {}).get("aiperf_version"), p, rows,
                   ap.aiperf_reported(summary) if summary else {},
                   {k: v for k, v in (summary or {}).items() if k not in ("telemetry_data",)}, settings,
                   schema=schema, counted=counted_of("aiperf", summary),
                   window_rule="AIPerf's profiling phase (its warm-up requests left out)")]


def guidellm_reported(bench: dict[str, Any]) -> dict[str, Any]:
    """GuideLLM's own figures of one benchmark (successful requests), in servelab's units, as
    `<metric>.<median|mean|p95>`."""
    out: dict[str, Any] = {}
    for name, m in (bench.get("metrics") or {}).items():
        s = (m or {}).get("successful") if isinstance(m, dict) else None
        if not isinstance(s, dict) or "median" not in s:
            continue
        scale = 1e-3 if name.endswith("_ms") else 1.0
        out[f"{name}.median"] = s["median"] * scale if s.get("median") is not None else None
        out[f"{name}.mean"] = s["mean"] * scale if s.get("mean") is not None else None
        p95 = (s.get("percentiles") or {}).get("p95")
        out[f"{name}.p95"] = p95 * scale if p95 is not None else None
    return out


def guidellm_schema(obj: dict[str, Any], bench: dict[str, Any]) -> str:
    """The GuideLLM report schema by its markers (a key of SCHEMAS)."""
    v = (obj.get("metadata") or {}).get("version")
    if v == 2:
        return "guidellm-v2"
    if v == 1:
        return "guidellm-v1"
    if "run_stats" in bench or "request_totals" in bench:
        return "guidellm-0.3"
    return "guidellm-0.4"


def _guidellm_counted(bench: dict[str, Any]) -> int | None:
    tot = (bench.get("metrics") or {}).get("request_totals") or bench.get("request_totals") or {}
    n = [tot.get(k) for k in ("successful", "errored", "incomplete")]
    return int(sum(x for x in n if x is not None)) if any(x is not None for x in n) else None


def _read_guidellm(p: Path, obj: dict[str, Any], config: str, bucket: str | None) -> list[Source]:
    version = (obj.get("metadata") or {}).get("guidellm_version")
    out = []
    for b in obj.get("benchmarks") or []:
        reqs = b.get("requests") or {}
        if not any(reqs.get(k) for k in ("successful", "errored", "incomplete")):
            raise _refuse(p, "a GuideLLM benchmark without per-request data (requests.successful is empty: saved "
                             "with request sampling at 0?): run it again with its requests kept "
                             "(--sample-requests unset)")
        rows = guidellm_rows(b, config=config, bucket_label=bucket)
        spec = ((obj.get("config") or {}).get("spec") or {})
        data = next(iter(spec.get("data") or []), {})
        if bucket is None and data.get("prompt_tokens") and data.get("output_tokens"):
            label = f"in{data['prompt_tokens']}-out{data['output_tokens']}"
            for r in rows:
                r.update(bucket=label, target_input_tokens=data["prompt_tokens"],
                         target_output_tokens=data["output_tokens"])
        metrics = {k: v for k, v in (b.get("metrics") or {}).items()
                   if k not in ("text", "image", "video", "audio", "tool_call")}  # per-modality counts: in the file
        summary = {**{k: v for k, v in b.items() if k not in ("requests", "metrics")}, "metrics": metrics}
        be = (b.get("config") or {}).get("backend") or {}
        worker = b.get("worker") or {}
        win = guidellm_window(b)
        rule = ("GuideLLM's measurement window (warm-up and cool-down cut; a request counts when it overlaps it)"
                if win else "as stored (GuideLLM 0.2-0.3 drops warm-up and cool-down requests as it collects them)")
        out.append(Source("guidellm", version, p, rows, guidellm_reported(b), summary,
                          {"model": be.get("model") or worker.get("backend_model") or (obj.get("args") or {}).get("model"),
                           "urls": [be.get("target") or worker.get("backend_target") or (obj.get("args") or {}).get("target")],
                           "concurrency": rows[0]["concurrency"] if rows else None},
                          schema=guidellm_schema(obj, b), counted=counted_of("guidellm", b),
                          window=list(win) if win else None, window_rule=rule))
    return out


def _read_vllm(p: Path, objs: list[dict[str, Any]], config: str, bucket: str | None) -> list[Source]:
    out = []
    for o in objs:
        if "ttfts" not in o:
            n = (o.get("completed") or 0) + (o.get("failed") or 0)
            raise _refuse(p, f"a `vllm bench serve` result without per-request data ({n} requests, summary only): "
                             "run it again with --save-result --save-detailed and import that JSON")
        rows = drop_role_chunk(pd.DataFrame(vllm_bench_rows(o, config=config, bucket_label=bucket))).to_dict("records")
        out.append(Source("vllm-bench", o.get("vllm_version"), p, rows, reported_of("vllm-bench", o), _strip(o),
                          {"model": o.get("model_id"), "concurrency": o.get("max_concurrency")},
                          schema="vllm-bench", counted=counted_of("vllm-bench", o)))
    return out


def _read_sglang(p: Path, objs: list[dict[str, Any]], config: str, bucket: str | None) -> list[Source]:
    out = []
    for o in objs:
        if "ttfts" not in o:
            raise _refuse(p, "an SGLang bench_serving result without per-request data: run it again with "
                             "--output-details and import that JSONL")
        rows = sglang_bench_rows(o, config=config, bucket_label=bucket)
        out.append(Source("sglang-bench", (o.get("server_info") or {}).get("version"), p, rows,
                          reported_of("sglang-bench", o), _strip(o),
                          {"model": (o.get("server_info") or {}).get("model_path"),
                           "concurrency": o.get("max_concurrency")}, schema="sglang-bench"))
    return out


def reported_of(tool: str, summary: dict[str, Any]) -> dict[str, Any]:
    """The tool's own figures of one run, from its summary as `Source.summary` keeps it (servelab units)."""
    if tool == "aiperf":
        return ap.aiperf_reported(summary) if summary else {}
    if tool == "guidellm":
        return guidellm_reported(summary)
    keys = (("median_ttft_ms", "median_tpot_ms", "median_itl_ms", "mean_itl_ms", "median_e2el_ms") if tool == "vllm-bench"
            else ("median_ttft_ms", "median_tpot_ms", "median_itl_ms", "median_e2e_latency_ms"))
    rep = vllm_bench_reported(summary) if tool == "vllm-bench" else sglang_bench_reported(summary)
    rep.update({k: summary[k] / 1000 for k in keys if summary.get(k) is not None})
    rep["output_throughput"] = summary.get("output_throughput")
    return rep


def counted_of(tool: str, summary: dict[str, Any]) -> int | None:
    """The requests the tool counted in its window, from its summary (None: it does not say)."""
    if tool == "aiperf":
        return ap.counted(summary)
    if tool == "guidellm":
        return _guidellm_counted(summary)
    if tool == "vllm-bench" and "completed" in summary:
        return int((summary.get("completed") or 0) + (summary.get("failed") or 0)) or None
    return None


def _summary_refusal(p: Path, found: str) -> ImportFormatError:
    if found == "aiperf-summary":
        return _refuse(p, "an AIPerf summary (profile_export_aiperf.json) holds no per-request data: "
                          + _beside(p, "profile_export.jsonl"))
    return _run_folder(p)


def read(path: Path | str, tool: str | None = None, *, config: str = "imported", bucket: str | None = None
         ) -> list[Source]:
    """Every run in `path` (a file; for AIPerf also its artifact folder) as Sources. `tool`: the
    format it must be (ImportFormatError when it is not); None: detected."""
    p = Path(path)
    if tool is not None and tool not in TOOLS:
        raise UserError(f"--tool {tool}: one of {', '.join(TOOLS)}")
    if p.is_dir():
        p = _folder(p)
    if not p.exists():
        raise UserError(f"{p}: no such file")
    kind, obj = parse_file(p)
    objs = obj if kind == "jsonl" else [obj]
    found = _kind_of(objs[0])
    if found in ("aiperf-summary", "servelab"):
        raise _summary_refusal(p, found)
    if tool is not None and found != tool:
        raise _fail(p, f"not {tool}'s format ({found or 'no tool'} recognised)", tool)
    if found is None:
        raise _fail(p, "no tool's result format recognised")
    try:
        if found == "aiperf":
            srcs = _read_aiperf(p, objs, config, bucket)
        elif found == "guidellm":
            srcs = _read_guidellm(p, objs[0], config, bucket)
        elif found == "vllm-bench":
            srcs = _read_vllm(p, objs, config, bucket)
        else:
            srcs = _read_sglang(p, objs, config, bucket)
    except ImportFormatError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:  # a damaged file of the right kind
        raise _fail(p, f"looks like {found} output but cannot be read ({type(e).__name__}: {e})", found) from None
    if not srcs or not any(s.rows for s in srcs):
        raise _fail(p, "no request in it", found)
    return srcs


def frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """Records as a frame with servelab's record columns first (extra columns kept after them)."""
    df = pd.DataFrame(rows)
    peer = RequestRecord.peer_columns()
    for c in peer:
        if c not in df:
            df[c] = None
    return df[peer + [c for c in df.columns if c not in peer]]


__all__ = ["EXPECTED", "ImportFormatError", "SCHEMAS", "Source", "TOOLS", "counted_of", "detect", "frame",
           "guidellm_reported", "guidellm_schema", "parse_file", "read", "reported_of"]
