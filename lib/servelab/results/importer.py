"""`servelab import FILE...`: other tools' result files as an ordinary run folder.

Every file is read first (`results.formats`); any that is not a result servelab can import stops
the import with one line naming it, and nothing is written. Then the run folder is written in a
temporary folder beside the destination and renamed into place at the end:

- records.jsonl: servelab's record fields, per-request metrics recomputed by servelab's definitions
  (`analysis.harmonise.recompute_per_request`); each run of the tool (a file, a GuideLLM benchmark,
  a JSON line) is one round of its level (bucket x concurrency), in the order given; a request the
  tool left out of its window (warm-up, cool-down) is kept, flagged `warmup` with `excluded` saying why;
- levels.jsonl: one line per level, as a measured run writes it;
- run.json: `imported` (tool, version, files with their sha256, and per run the format it was
  recognised by, its window and how many requests it stored of those the tool counted), the model
  and server as the tool recorded them, `packages` (the tool and its version), the headline
  (measure.runfiles.finalize);
- source_summary.json: the tool's own summary of each run as it wrote it (per-request lists left out);
- harmonised.json: each figure of the tool beside servelab's recomputation (`analysis.harmonise`), and
  the metrics its data cannot give;
- source/: the imported files themselves (and AIPerf's summary beside its export); files of one name
  are numbered (`01-profile_export.jsonl`, ...).
Not for reading formats (`results.formats`) or for comparing runs (`results.compare`)."""

from __future__ import annotations

import math
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from .. import __version__
from ..analysis.harmonise import agreement, definitions, harmonised_rows, recompute_per_request, unexplained
from ..analysis.peers import guidellm_window
from ..errors import RunFolderExists, UserError
from ..measure.runfiles import finalize
from ..models.gguf import file_sha256
from ..runfolder import LEVELS, RECORDS, RunFolder, now_iso, read_json, runs_root, write_json
from .formats import Source, counted_of, frame, guidellm_schema, parse_file, read, reported_of

SOURCE_SUMMARY = "source_summary.json"
HARMONISED = "harmonised.json"
SOURCE_DIR = "source"


@dataclass
class ImportResult:
    path: Path
    tool: str
    version: str | None
    requests: int
    levels: int
    rounds: int
    harmonised: pd.DataFrame
    sources: list[Source] = field(default_factory=list)

    def line(self) -> str:
        """The command's one line: what was read (format, window, sample) and how the figures compare."""
        h = self.harmonised[self.harmonised["tool_value"].notna()] if len(self.harmonised) else self.harmonised
        reasons = h["reason"].fillna("") if len(h) else pd.Series(dtype=str)
        agree = int((h["within"] == True).sum()) if len(h) else 0  # noqa: E712
        differ = int(reasons.str.startswith("definitional").sum())
        quoted = int(reasons.str.startswith("sampled").sum())
        bad = len(unexplained(h)) if len(h) else 0
        ok5, n5 = agreement(h)
        unchecked = int((pd.to_numeric(h["servelab_tool_def"], errors="coerce").isna() & ~reasons.str.startswith("sampled")
                         ).sum()) if len(h) else 0
        stored = sum(s.measured for s in self.sources)
        counted = [s.counted for s in self.sources]
        excluded: dict[str, int] = {}
        for s in self.sources:
            for k, n in s.excluded.items():
                excluded[k] = excluded.get(k, 0) + n
        kept = (f"; {sum(excluded.values())} outside the tool's window kept and flagged ("
                + ", ".join(f"{n} {k}" for k, n in excluded.items()) + ")") if excluded else ""
        sample = (f"; a sampled report: {stored} of the {sum(c for c in counted if c)} requests it counted are "
                  "stored" if any(s.sampled for s in self.sources) else "")
        schema = ", ".join(dict.fromkeys(s.schema for s in self.sources))
        return (f"{self.path}: {self.requests} requests of {self.tool} {self.version or '(version not stated)'} "
                f"[{schema}] ({self.levels} levels, {self.rounds} runs){kept}{sample}; {agree} of its figures agree "
                f"with servelab's recomputation within the tolerance, {differ} differ by a named definition, "
                f"{quoted} quoted from the sampled report, {bad} unexplained; {ok5} of {n5} within 5 % recomputed "
                "by the tool's definition" + (f" ({unchecked} not recomputable so from these records)" if unchecked
                                              else ""))


def _destination(out: str | Path | None, study: str | None, config: str | None, sources: list[Source]) -> Path:
    if out:
        return Path(out)
    if study or config:
        if not (study and config):
            raise UserError("--study and --config go together (the run folder runs/<study>/<config>)")
        return runs_root() / study / config
    first = sources[0]
    return runs_root() / "imported" / f"{first.tool}-{first.path.stem}"


def _number(rows: list[Source], study: str, config: str) -> pd.DataFrame:
    """All runs' records: one round per run within its level, levels numbered by concurrency."""
    levels = sorted({s.level for s in rows}, key=lambda k: (k[1], k[0]))
    index = {k: i for i, k in enumerate(levels)}
    frames, seq = [], 0
    for s, rnd in _rounds(rows):
        f = frame(s.rows)
        f["round"] = rnd
        f["seq"] = range(seq, seq + len(f))
        seq += len(f)
        f["level"] = index[s.level]
        f["study"], f["config"], f["source_file"] = study, config, s.path.name
        frames.append(f)
    return recompute_per_request(pd.concat(frames, ignore_index=True))


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def import_files(files: Sequence[str | Path], *, tool: str | None = None, out: str | Path | None = None,
                 study: str | None = None, config: str | None = None, bucket: str | None = None,
                 force: bool = False) -> ImportResult:
    """Import `files` (all of one tool) into one run folder; returns where and what."""
    if not files:
        raise UserError("give at least one result file")
    srcs: list[Source] = []
    for f in files:
        srcs += read(f, tool, config=config or "imported", bucket=bucket)
    tools = {s.tool for s in srcs}
    if len(tools) > 1:
        raise UserError(f"one tool per run folder: {', '.join(sorted(tools))} given; import them one at a time")
    tool_name = srcs[0].tool
    dest = _destination(out, study, config, srcs)
    study_id = study or dest.parent.name
    config_id = config or dest.name
    if dest.exists() and any(dest.iterdir()) and not force:
        raise RunFolderExists(f"{dest} exists: runs are immutable; pass --force to replace it or choose --out")
    df = _number(srcs, study_id, config_id)
    tdef = definitions().of(tool_name)
    reported = {(s.level[0], s.level[1], r): s.reported for s, r in _rounds(srcs)}
    runs = {(s.level[0], s.level[1], r): {"counted": s.counted, "window": s.window} for s, r in _rounds(srcs)}
    harm = harmonised_rows(df, reported, tdef, runs)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.importing-", dir=dest.parent))
    tmp.chmod(0o755)  # mkdtemp's folder is private; a run folder is not
    try:
        _write(tmp, df, srcs, harm, tdef, study_id, config_id)
        if dest.exists():
            old = dest.with_name(f".{dest.name}.replaced")
            shutil.rmtree(old, ignore_errors=True)
            dest.rename(old)
            shutil.rmtree(old)
        tmp.rename(dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    n_rounds = len(srcs)
    return ImportResult(dest, tool_name, srcs[0].version, len(df), df["level"].nunique(), n_rounds, harm, srcs)


def _schema_of(tool: str, summary: dict[str, Any], src_dir: Path) -> str:
    """The format a run imported by an earlier servelab was in, from its summary (and a source copy)."""
    if tool == "aiperf":
        return "aiperf-0.2" if "aiperf_version" in summary else "aiperf-0.1"
    if tool == "guidellm":
        for f in sorted(src_dir.glob("*")):
            if f.suffix in (".json", ".yaml", ".yml"):
                try:
                    _, obj = parse_file(f)
                    return guidellm_schema(obj, summary)
                except UserError:
                    continue
        return guidellm_schema({}, summary)
    return tool


def reharmonise(path: str | Path) -> ImportResult:
    """Re-derive an imported run folder's harmonised.json and run.json's per-run import description
    (format, window, sample) from its records and source_summary.json with this checkout's readers'
    rules and definitions: for a run folder imported by an earlier servelab whose tool files are
    not all at hand. Records are not rewritten; a request outside the tool's window is flagged in
    the harmonisation only (the published records keep what they had); per-request values of the
    tool that the old records do not keep stay unchecked (said in the reason)."""
    path = Path(path)
    rf = RunFolder(path)
    run = rf.run
    imp = run.get("imported") or {}
    if not imp or not (path / SOURCE_SUMMARY).exists():
        raise UserError(f"{path}: not a run folder `servelab import` wrote (no imported block or {SOURCE_SUMMARY})")
    tool = imp["tool"]
    df = rf.records.copy()
    if "excluded" not in df:
        df["excluded"] = None
    entries = read_json(path / SOURCE_SUMMARY)
    srcs: list[Source] = []
    for entry in entries:
        bucket, conc = entry["level"]
        summ = entry["summary"]
        g = df[(df["bucket"] == bucket) & (df["concurrency"] == conc) & (df["round"] == entry["round"])]
        win = guidellm_window(summ) if tool == "guidellm" else None
        if win is not None:  # flag what the tool's window leaves out, where the old records do not say
            for i in g.index[g["excluded"].isna()]:
                lo, hi = win
                why = "warm-up" if g.at[i, "end_s"] < lo else ("cool-down" if g.at[i, "start_s"] > hi else None)
                df.loc[i, ["excluded", "warmup"]] = [why, bool(g.at[i, "warmup"]) or why is not None]
        if tool == "guidellm" and "tool_tpot_s" not in df:  # its TPOT: request latency / output tokens
            df["tool_tpot_s"] = pd.to_numeric(df["e2e_s"], errors="coerce") / pd.to_numeric(df["output_tokens"],
                                                                                           errors="coerce")
        rule = ("GuideLLM's measurement window (warm-up and cool-down cut; a request counts when it overlaps it)"
                if win else "AIPerf's profiling phase (its warm-up requests left out)" if tool == "aiperf"
                else "every request")
        srcs.append(Source(tool, entry.get("version"), Path(entry["file"]), df.loc[g.index].to_dict("records"),
                           reported_of(tool, summ), summ, schema=_schema_of(tool, summ, path / SOURCE_DIR),
                           counted=counted_of(tool, summ), window=list(win) if win else None, window_rule=rule))
    rounds = [e["round"] for e in entries]
    keys = [(s.level[0], s.level[1], r) for s, r in zip(srcs, rounds)]
    tdef = definitions().of(tool)
    harm = harmonised_rows(df, {k: s.reported for k, s in zip(keys, srcs)}, tdef,
                           {k: {"counted": s.counted, "window": s.window} for k, s in zip(keys, srcs)})
    _write_harmonised(path, srcs, harm, tdef, rounds)
    imp.update(schema=srcs[0].schema,
               runs=[{"round": r, "level": list(s.level), **s.describe()} for s, r in zip(srcs, rounds)])
    rf.write_run({k: x for k, x in {**run, "imported": imp}.items() if k != "format_version"})
    return ImportResult(path, tool, imp.get("version"), int((~df["warmup"].astype(bool)).sum()),
                        int(df["level"].nunique()), len(srcs), harm, srcs)


def _write_harmonised(dest: Path, srcs: list[Source], harm: pd.DataFrame, tdef: Any, rounds: list[int]) -> None:
    write_json(dest / HARMONISED, {
        "tool": tdef.tool, "name": tdef.name, "percentiles": tdef.percentiles,
        "definitions": {f.field: {"label": f.label, "metric": f.metric, "stat": f.stat, "same": f.same,
                                  "differs": f.differs, "definition": f.definition, "why": f.why,
                                  "by_tool": f.by_tool.model_dump(exclude_none=True)} for f in tdef.figures},
        "runs": [{"round": r, "level": list(s.level), **s.describe()} for s, r in zip(srcs, rounds)],
        "servelab": dict(definitions().servelab),
        "not_recomputable": dict(tdef.not_recomputable),
        "rows": [{k: _clean(v) for k, v in r.items()} for r in harm.to_dict("records")]})


def _rounds(srcs: list[Source]) -> list[tuple[Source, int]]:
    seen: dict[tuple[str, int], int] = {}
    out = []
    for s in srcs:
        r = seen.get(s.level, 0)
        seen[s.level] = r + 1
        out.append((s, r))
    return out


def _write(tmp: Path, df: pd.DataFrame, srcs: list[Source], harm: pd.DataFrame, tdef: Any, study: str,
           config: str) -> None:
    rf = RunFolder(tmp)
    with rf.writer(RECORDS) as w:  # typed: each record validated and versioned
        for rec in df.to_dict("records"):
            w.write({k: _clean(v) for k, v in rec.items()}, allow_nan=False)
    with rf.writer(LEVELS) as w:
        for (lvl, bucket, conc), g in df.groupby(["level", "bucket", "concurrency"], sort=True):
            m = g[~g["warmup"].astype(bool)]
            w.write({"level": int(lvl), "label": f"{bucket} c={int(conc)}", "status": "complete", "sent": int(len(m)),
                     "failed": int((~m["ok"].astype(bool)).sum()), "rounds": int(m["round"].nunique()),
                     "imported": True})
    (tmp / SOURCE_DIR).mkdir()
    files = []
    paths = list(dict.fromkeys(s.path for s in srcs))
    clash = len({p.name for p in paths}) < len(paths)
    for i, p in enumerate(paths, 1):
        stored = f"{i:02d}-{p.name}" if clash else p.name  # several files of one name (one per run): numbered
        shutil.copy(p, tmp / SOURCE_DIR / stored)
        files.append({"name": p.name, "stored_as": stored, "sha256": file_sha256(p),
                      "runs": sum(1 for s in srcs if s.path == p)})
        beside = p.with_name(p.name.replace("profile_export.jsonl", "profile_export_aiperf.json"))
        if srcs[0].tool == "aiperf" and beside.exists() and beside != p:
            shutil.copy(beside, tmp / SOURCE_DIR / (f"{i:02d}-{beside.name}" if clash else beside.name))
    write_json(tmp / SOURCE_SUMMARY, [{"file": s.path.name, "round": r, "level": list(s.level), "tool": s.tool,
                                       "version": s.version, "summary": s.summary} for s, r in _rounds(srcs)])
    _write_harmonised(tmp, srcs, harm, tdef, [r for _, r in _rounds(srcs)])
    settings = next((s.settings for s in srcs if s.settings), {})
    start = pd.to_numeric(df["start_s"], errors="coerce").min()
    record: dict[str, Any] = {
        "study": study, "config": config, "status": "running",
        "started_at": pd.Timestamp(start, unit="s", tz="UTC").isoformat() if start and start > 1e9 else None,
        "servelab": {"version": __version__},
        "imported": {"tool": srcs[0].tool, "name": tdef.name, "version": srcs[0].version, "files": files,
                     "imported_at": now_iso(), "schema": srcs[0].schema,
                     "runs": [{"round": r, "level": list(s.level), **s.describe()} for s, r in _rounds(srcs)]},
        "packages": {srcs[0].tool: srcs[0].version} if srcs[0].version else {},
        "server": {"mode": "imported", "model": settings.get("model"), "urls": settings.get("urls")},
        "model_name": settings.get("model"),
        "workload": {"levels": sorted({f"{b} c={c}" for b, c in (s.level for s in srcs)})},
    }
    finalize(rf, record, status="complete", message=f"imported from {tdef.name}")
