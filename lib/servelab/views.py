"""What the stage notebooks display: the launch command, the load levels, the model's facts, the
engine's handle, a run's per-level summary, an interleaved benchmark's sampling (design.json) and the
server's metrics per level, as small tables with readable units. Not for measuring (`stages`) nor
for the write-up (`report`)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pandas as pd

from .measure.grid import levels, requests_per_round
from .models import model_facts
from .plan import ConfigPlan
from .runfolder import RunFolder
from .schema.runfiles import DesignRecord


def launch_plan(plan: ConfigPlan, python: str | None = None) -> str:
    """What `launch` will start or reach for this configuration (the dry-run lines): the engine
    command with its derived values, shell-quoted, in the host's words."""
    return "\n".join(plan.launch_lines(python))


def level_plan(plan: ConfigPlan) -> pd.DataFrame:
    """The load levels `benchmark` will send: bucket, concurrency (or rate), rounds, requests."""
    wl = plan.workload
    rows = [{"bucket": lv.bucket.label, "load": lv.label.split(" ", 1)[1], "warmup rounds": wl.warmup_rounds,
             "measured rounds": wl.rounds, "requests per round": requests_per_round(wl, lv)} for lv in levels(wl)]
    return pd.DataFrame(rows)


def model_facts_table(host: dict[str, Any]) -> pd.DataFrame:
    """Architecture facts of the provisioned model as a two-column table (the URL for attach)."""
    if not host.get("model_dir"):
        return pd.DataFrame({"fact": ["url"], "value": [host.get("url")]})
    f = model_facts(Path(host["model_dir"]))
    return pd.DataFrame({"fact": list(f), "value": [str(v) for v in f.values()]})


def launch_table(handle: dict[str, Any]) -> pd.DataFrame:
    info = handle.get("info", {})
    rows = {"mode": handle.get("mode"), "base_url": handle.get("base_url"), "model": handle.get("model"),
            "version": info.get("version"),
            "startup_s": f"{info['startup_s']:.1f}" if info.get("startup_s") else None,
            "command": shlex.join(info.get("command") or [])}
    return pd.DataFrame({"": list(rows), "value": list(rows.values())})


def summary_table(summary: pd.DataFrame) -> pd.DataFrame:
    """The per-level summary with readable units (ms, tok/s, %)."""
    if summary is None or summary.empty:
        return summary
    t = summary[["bucket", "concurrency", "sent", "ok", "prompt_tokens", "output_tokens_p50", "ttft_p50_s",
                 "ttft_p95_s", "decode_tps_p50", "e2e_output_tps_p50", "aggregate_output_tps",
                 "aggregate_output_tps_min", "aggregate_output_tps_max", "failures"]].copy()
    for c in ("ttft_p50_s", "ttft_p95_s"):
        t[c] = t[c] * 1000
    t = t.rename(columns={"ttft_p50_s": "TTFT p50 ms", "ttft_p95_s": "TTFT p95 ms", "decode_tps_p50": "decode tok/s",
                          "e2e_output_tps_p50": "E2E tok/s", "aggregate_output_tps": "aggregate tok/s",
                          "aggregate_output_tps_min": "agg min", "aggregate_output_tps_max": "agg max",
                          "output_tokens_p50": "output tokens", "prompt_tokens": "prompt tokens"})
    return t.round(1)


def sampling_table(design: DesignRecord) -> pd.DataFrame:
    """Per level of an interleaved benchmark: measured rounds per configuration, why its sampling
    stopped, its seconds (of them the warm-up's), the disturbed rounds and those measured again
    (design.json's `levels`)."""
    rows = [{"level": x.label, **{f"rounds {k}": n for k, n in x.rounds.items()}, "stopped": x.stopped,
             "seconds": round(x.seconds, 1), "warm-up s": round(x.warmup_s, 1), "disturbed": x.disturbed,
             "measured again": x.remeasured, "last note": x.note} for x in design.levels]
    return pd.DataFrame(rows)


def server_metrics_table(run: RunFolder) -> pd.DataFrame:
    """Per level: peak KV usage, running, waiting and the preemptions counted during it."""
    s = run.samples
    if s is None or s.empty or "level" not in s:
        reason = getattr(s, "attrs", {}).get("reason") if s is not None else "no server_metrics.jsonl"
        return pd.DataFrame({"server metrics": [f"not available ({reason})"]})
    g = s.dropna(subset=["level"]).groupby("level", sort=False)
    out = pd.DataFrame({
        "samples": g.size(),
        "KV usage max %": g["kv_usage_frac"].max() * 100,
        "running max": g["running"].max(),
        "waiting max": g["waiting"].max(),
        "preemptions": g["preemptions_total"].max() - g["preemptions_total"].min(),
    })
    return out.round(1)


def quality_line(q: dict[str, Any] | None) -> str:
    """The quality check's result in one line (quality.json as `quality` returned it)."""
    if q is None:
        return "quality check: off"
    if not q["measurable"]:
        return f"quality check: not measurable ({q['reason']})"
    return f"quality check: {q['score']['correct']}/{q['score']['total']} known answers"


__all__ = ["launch_plan", "launch_table", "level_plan", "model_facts_table", "quality_line", "sampling_table",
           "server_metrics_table", "summary_table"]
