"""A run folder's life around the runner: opened (new, or prepared to resume: records of unfinished
levels moved aside), and closed (run.json's final fields from what the folder holds: status, reason,
record count, headline, client-limited rounds). Not for sending (`runner`)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import RunFolderExists
from ..runfolder import CLIENT_STATS, LEVELS, RECORDS, JsonlWriter, RunFolder, mark_records, now_iso, read_jsonl

# A level is flagged as client-limited when the client's event loop lagged this much (p99)
# or the client process used this share of one CPU core (see `client_limited`).
LAG_LIMIT_S = 0.005

CPU_LIMIT_FRAC = 0.9


@dataclass
class ResumeState:
    done_levels: set[int]
    next_seq: int


def prepare_resume(run_dir: Path) -> ResumeState:
    """Keep records of finished levels only; move the rest aside. Returns what to skip."""
    done = {int(x["level"]) for x in read_jsonl(run_dir / LEVELS)}
    recs = read_jsonl(run_dir / RECORDS)
    keep = [r for r in recs if r.get("level") in done]
    drop = [r for r in recs if r.get("level") not in done]
    if drop:
        with JsonlWriter(run_dir / f"records.superseded-{int(time.time())}.jsonl") as w:
            for r in drop:
                w.write(r)
    tmp = run_dir / (RECORDS + ".tmp")
    with JsonlWriter(tmp) as w:
        for r in keep:
            w.write(r)
    tmp.replace(run_dir / RECORDS)
    stats = [s for s in read_jsonl(run_dir / CLIENT_STATS) if s.get("level") in done]
    (run_dir / CLIENT_STATS).unlink(missing_ok=True)
    with JsonlWriter(run_dir / CLIENT_STATS) as w:
        for s in stats:
            w.write(s)
    return ResumeState(done, max((r["seq"] for r in recs), default=-1) + 1)


def open_run_folder(run_dir: Path, resume: bool) -> tuple[RunFolder, ResumeState | None]:
    """The run folder to write, created if new; with `resume`, an existing one prepared to continue
    (`prepare_resume`). Raises FileExistsError for an existing run without `resume` (runs are
    immutable)."""
    rf, state = RunFolder(run_dir), None
    if rf.exists(RECORDS):
        if not resume:
            raise RunFolderExists(f"{rf / RECORDS} exists: runs are immutable; remove the folder, use a new id "
                                  "or --resume")
        state = prepare_resume(rf.path)
    rf.path.mkdir(parents=True, exist_ok=True)
    return rf, state


def warming_reason(ttfts: list[float]) -> str:
    """Why a level's first pass was measured again (`runner.LevelRunner.warming_again`)."""
    return "still warming up: TTFT " + " > ".join(f"{t * 1e3:.0f}" for t in ttfts) + " ms; measured again"


def warming_marks(run_dir: Path) -> dict[tuple[int, int, int], str]:
    """(level, round, 0) -> reason for the first pass of every level whose line says it was measured
    again (`warming_ttft_s`): its measured records, not its warm-up. Read from the folder, so a run
    killed between the level's line and its closing write is marked when it is closed or resumed."""
    again = {int(x["level"]): warming_reason(x["warming_ttft_s"]) for x in read_jsonl(run_dir / LEVELS)
             if x.get("warming_ttft_s")}
    if not again:
        return {}
    return {(int(r["level"]), int(r["round"]), 0): again[int(r["level"])] for r in read_jsonl(run_dir / RECORDS)
            if r.get("level") in again and not r.get("warmup") and not r.get("attempt")}


def finalize(rf: RunFolder, record: dict[str, Any], *, status: str, message: str,
             measured_from: str | None = None) -> Any:
    """Write run.json's closing fields from what the folder holds (status, reason, record count,
    headline, client-limited levels; a first pass measured again marked in its records, nothing
    deleted); returns the summary. Also used by the pipeline when a stage process died before it
    could write them itself."""
    mark_records(rf.path / RECORDS, warming_marks(rf.path))
    rf.invalidate()
    summ = rf.summary
    record.update({"status": status, "message": message, "finished_at": now_iso(), "records": len(rf.records),
                   "headline": _headline(summ), "client_limited_levels": client_limited(rf.path)})
    if measured_from:
        record["measured_from"] = measured_from
    rf.write_run(record)
    return summ


def client_limited(run_dir: Path) -> list[dict[str, Any]]:
    """Measured rounds where the client itself may have limited the result."""
    out = []
    for s in read_jsonl(Path(run_dir) / CLIENT_STATS):
        if s.get("warmup") or "loop_lag_p99_s" not in s:
            continue
        reasons = []
        if s["loop_lag_p99_s"] > LAG_LIMIT_S:
            reasons.append(f"event-loop lag p99 {s['loop_lag_p99_s'] * 1000:.1f} ms > {LAG_LIMIT_S * 1000:.0f} ms")
        if s["cpu_frac"] > CPU_LIMIT_FRAC * max(1, s.get("workers", 1)):
            reasons.append(f"client CPU {s['cpu_frac'] * 100:.0f}% of a core")
        if reasons:
            out.append({"level": s["level"], "label": s["label"], "round": s["round"], "reasons": reasons})
    return out


def _headline(summ: Any) -> dict[str, Any]:
    if summ is None or getattr(summ, "empty", True):
        return {}
    sent = int(summ["sent"].sum())
    return {
        "sent": sent, "ok": int(summ["ok"].sum()),
        "success_rate": float(summ["ok"].sum() / sent) if sent else None,
        "max_aggregate_output_tps": float(summ["aggregate_output_tps"].max()),
        "decode_tps_p50_at_c1": _at_c1(summ, "decode_tps_p50"),
        "ttft_p50_s_at_c1": _at_c1(summ, "ttft_p50_s"),
    }


def _at_c1(summ: Any, col: str) -> dict[str, float]:
    c1 = summ[summ["concurrency"] == summ["concurrency"].min()]
    return {str(b): float(v) for b, v in zip(c1["bucket"], c1[col])}
