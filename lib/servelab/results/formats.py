"""Result files of other benchmark tools: which tool wrote a file (`detect`), and the file read as
runs (`read`): one `Source` per run of the tool in it (an AIPerf export, a GuideLLM benchmark, a
`vllm bench serve` result object, an SGLang bench_serving line), each with servelab's records of its
requests (analysis.peers, analysis.sglang_bench, analysis.aiperf), the tool's own figures in
servelab's units, and the tool's summary as it wrote it (per-request lists left out).

A file that is not one of these (truncated, foreign, or without per-request data) raises
`ImportFormatError`: one line naming the file and the formats expected. Not for writing run
folders (`results.importer`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from ..analysis import aiperf as ap
from ..analysis.harmonise import drop_role_chunk
from ..analysis.peers import guidellm_rows, vllm_bench_reported, vllm_bench_rows
from ..analysis.sglang_bench import sglang_bench_reported, sglang_bench_rows
from ..errors import UserError
from ..summary import RECORD_COLUMNS

TOOLS = ("aiperf", "guidellm", "vllm-bench", "sglang-bench")
EXPECTED = ("AIPerf 0.13 profile_export.jsonl (or its artifact folder), GuideLLM 0.8 benchmarks.json/.yaml, "
            "`vllm bench serve --save-result --save-detailed` JSON, SGLang bench_serving --output-details JSONL")
PER_REQUEST_LISTS = ("ttfts", "itls", "input_lens", "output_lens", "latencies", "start_times", "errors",
                     "generated_texts", "queue_times")


class ImportFormatError(UserError, ValueError):
    """The file is not a result servelab can import: exit 2, nothing written."""


@dataclass
class Source:
    """One run of a tool read from a file: its requests as servelab records, its own figures."""

    tool: str
    version: str | None
    path: Path
    rows: list[dict[str, Any]]
    reported: dict[str, Any] = field(default_factory=dict)  # the tool's figures, servelab units
    summary: dict[str, Any] = field(default_factory=dict)  # the tool's summary as written (no per-request lists)
    settings: dict[str, Any] = field(default_factory=dict)  # model, url, concurrency as the tool recorded them

    @property
    def level(self) -> tuple[str, int]:
        r = self.rows[0]
        return str(r["bucket"]), int(r["concurrency"])


def _fail(path: Path, why: str, tool: str | None = None) -> ImportFormatError:
    want = {"aiperf": "an AIPerf 0.13 profile_export.jsonl (or its artifact folder)",
            "guidellm": "a GuideLLM 0.8 benchmarks.json/.yaml report",
            "vllm-bench": "a `vllm bench serve --save-result --save-detailed` JSON",
            "sglang-bench": "an SGLang bench_serving --output-details JSONL"}
    expected = want[tool] if tool else f"one of: {EXPECTED}"
    return ImportFormatError(f"{path}: {why}; expected {expected}")


def _parse(path: Path) -> tuple[str, Any]:
    """("json", object) | ("jsonl", [objects]) | ("yaml", object); ImportFormatError otherwise."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise _fail(path, "not a text file") from None
    if not text.strip():
        raise _fail(path, "empty file")
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
    raise _fail(path, f"not valid JSON ({whole.msg} at line {whole.lineno} column {whole.colno}): truncated?")


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
    return None


def detect(path: Path | str) -> str:
    """The tool that wrote `path` (one of TOOLS); ImportFormatError if none did."""
    p = Path(path)
    if p.is_dir():
        p = _aiperf_file(p)
    return read(p)[0].tool


def _aiperf_file(d: Path) -> Path:
    hits = sorted(d.glob("*profile_export.jsonl"))
    if not hits:
        raise _fail(d, "a folder without a profile_export.jsonl", "aiperf")
    return hits[0]


def _strip(obj: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in PER_REQUEST_LISTS}


def _read_aiperf(p: Path, objs: list[Any], config: str, bucket: str | None) -> list[Source]:
    if not all(ap.is_record(o) for o in objs):
        raise _fail(p, "some lines are not AIPerf request records", "aiperf")
    sp = p.with_name(p.name.replace("profile_export.jsonl", ap.SUMMARY_NAME))
    summary = json.loads(sp.read_text(encoding="utf-8")) if sp.exists() else None
    rows = ap.aiperf_rows(objs, config=config, summary=summary, bucket_label=bucket)
    settings = ap.summary_settings(summary)
    if summary is not None and settings.get("streaming") is False:
        raise _fail(p, "AIPerf ran without --streaming: no TTFT or chunk times to recompute", "aiperf")
    return [Source("aiperf", (summary or {}).get("aiperf_version"), p, rows,
                   ap.aiperf_reported(summary) if summary else {},
                   {k: v for k, v in (summary or {}).items() if k not in ("telemetry_data",)}, settings)]


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


def _read_guidellm(p: Path, obj: dict[str, Any], config: str, bucket: str | None) -> list[Source]:
    version = (obj.get("metadata") or {}).get("guidellm_version")
    out = []
    for b in obj.get("benchmarks") or []:
        reqs = b.get("requests") or {}
        if not any(reqs.get(k) for k in ("successful", "errored", "incomplete")):
            raise _fail(p, "a benchmark without per-request data (requests.successful is empty)", "guidellm")
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
        out.append(Source("guidellm", version, p, rows, guidellm_reported(b), summary,
                          {"model": be.get("model"), "urls": [be.get("target")],
                           "concurrency": rows[0]["concurrency"] if rows else None}))
    return out


def _read_vllm(p: Path, objs: list[dict[str, Any]], config: str, bucket: str | None) -> list[Source]:
    out = []
    for o in objs:
        if "ttfts" not in o:
            raise _fail(p, "a vllm bench serve result without per-request data (run it with --save-detailed): "
                           "none of TTFT, e2e, TPOT, ITL or tokens can be recomputed", "vllm-bench")
        rows = drop_role_chunk(pd.DataFrame(vllm_bench_rows(o, config=config, bucket_label=bucket))).to_dict("records")
        rep = vllm_bench_reported(o)
        rep.update({k: o[k] / 1000 for k in ("median_ttft_ms", "median_tpot_ms", "median_itl_ms", "mean_itl_ms",
                                              "median_e2el_ms") if o.get(k) is not None})
        rep["output_throughput"] = o.get("output_throughput")
        out.append(Source("vllm-bench", None, p, rows, rep, _strip(o),
                          {"model": o.get("model_id"), "concurrency": o.get("max_concurrency")}))
    return out


def _read_sglang(p: Path, objs: list[dict[str, Any]], config: str, bucket: str | None) -> list[Source]:
    out = []
    for o in objs:
        if "ttfts" not in o:
            raise _fail(p, "an SGLang bench_serving result without per-request data (run it with --output-details)",
                        "sglang-bench")
        rows = sglang_bench_rows(o, config=config, bucket_label=bucket)
        rep = sglang_bench_reported(o)
        rep.update({k: o[k] / 1000 for k in ("median_ttft_ms", "median_tpot_ms", "median_itl_ms",
                                              "median_e2e_latency_ms") if o.get(k) is not None})
        rep["output_throughput"] = o.get("output_throughput")
        out.append(Source("sglang-bench", (o.get("server_info") or {}).get("version"), p, rows, rep, _strip(o),
                          {"model": (o.get("server_info") or {}).get("model_path"),
                           "concurrency": o.get("max_concurrency")}))
    return out


def read(path: Path | str, tool: str | None = None, *, config: str = "imported", bucket: str | None = None
         ) -> list[Source]:
    """Every run in `path` (a file; for AIPerf also its artifact folder) as Sources. `tool`: the
    format it must be (ImportFormatError when it is not); None: detected."""
    p = Path(path)
    if tool is not None and tool not in TOOLS:
        raise UserError(f"--tool {tool}: one of {', '.join(TOOLS)}")
    if p.is_dir():
        p = _aiperf_file(p)
    if not p.exists():
        raise UserError(f"{p}: no such file")
    kind, obj = _parse(p)
    objs = obj if kind == "jsonl" else [obj]
    found = _kind_of(objs[0])
    if found == "aiperf-summary":
        raise _fail(p, "an AIPerf summary (profile_export_aiperf.json) has no per-request data: import the "
                       "profile_export.jsonl beside it", "aiperf")
    if tool is not None and found != tool:
        raise _fail(p, f"not {tool}'s format ({found or 'no tool'} recognised)", tool)
    if found is None:
        raise _fail(p, "no tool's result format recognised")
    want = found
    try:
        if want == "aiperf":
            srcs = _read_aiperf(p, objs, config, bucket)
        elif want == "guidellm":
            srcs = _read_guidellm(p, objs[0], config, bucket)
        elif want == "vllm-bench":
            srcs = _read_vllm(p, objs, config, bucket)
        else:
            srcs = _read_sglang(p, objs, config, bucket)
    except ImportFormatError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:  # a damaged file of the right kind
        raise _fail(p, f"looks like {want} output but cannot be read ({type(e).__name__}: {e})", want) from None
    if not srcs or not any(s.rows for s in srcs):
        raise _fail(p, "no request in it", want)
    return srcs


def frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """Records as a frame with servelab's record columns first (extra columns kept after them)."""
    df = pd.DataFrame(rows)
    for c in RECORD_COLUMNS:
        if c not in df:
            df[c] = None
    return df[RECORD_COLUMNS + [c for c in df.columns if c not in RECORD_COLUMNS]]


__all__ = ["EXPECTED", "ImportFormatError", "Source", "TOOLS", "detect", "frame", "guidellm_reported", "read"]
