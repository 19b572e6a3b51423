"""The pipeline stages of one configuration, as plain functions the stage notebooks call.

provision -> launch -> benchmark each read and write files in the run folder
`runs/<study>/<config>/`, so every stage can run in its own process (papermill executes one
notebook per stage): `launch` leaves the engine running and writes `engine.json`; `benchmark`
reads it; `stop` ends the engine from that handle. What differs between a local process, an
attached server and an AWS host is the study's `Host` (`servelab.hosts`). Not for diagnosis or
the write-up (`analysis`, `report`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pandas as pd

from .engines.smoke import smoke_check
from .hosts import Host, Server, for_study
from .hosts.attach import serve, stop_served
from .hosts.process import RssWatcher
from .measure.runinfo import base_record, engine_gpu_devices, model_record
from .measure.runner import RunResult, run_workload
from .models import model_facts
from .runfolder import ENGINE_JSON, HOST_JSON, RunFolder, read_json, runs_root, write_json
from .schema import Study, resolve_profile


def run_dir(study: str, config_id: str, root: Path | None = None) -> Path:
    return Path(root or runs_root()) / study / config_id


def provision(study: Study, config_id: str, rdir: Path) -> dict[str, Any]:
    """Prepare the host for one configuration (local: build the model directory offline)."""
    return for_study(study).provision(config_id, Path(rdir))


def launch(study: Study, config_id: str, rdir: Path) -> dict[str, Any]:
    """Start the engine (local), reach it (attach, AWS); run the smoke check; writes engine.json."""
    host = for_study(study)
    handle = host.launch(config_id, Path(rdir))
    handle["info"]["smoke_check"] = smoke(study, config_id, handle, host)
    write_json(Path(rdir) / ENGINE_JSON, handle)
    return handle


def smoke(study: Study, config_id: str, handle: dict[str, Any], host: Host | None = None) -> dict[str, Any]:
    """Seed 000's functional check: a chat reply and, with a tool-call parser, a tool call.
    With dummy weights the answers are recorded but the check does not apply."""
    host = host or for_study(study)
    eng = study.engine_for(config_id)
    try:
        return smoke_check(handle["base_url"], handle["model"], host.client_headers(config_id, handle),
                           tool_call=bool(eng.args.get("tool-call-parser")),
                           dummy_weights=host.weights_known(handle) and eng.load_format == "dummy", max_tokens=16)
    except Exception as e:  # the check is a record, never a reason to stop the measurement
        return {"applies": None, "ok": False, "reason": f"smoke check failed: {type(e).__name__}: {e}"}


def server_from_handle(rdir: Path, study: Study, config_id: str) -> Server:
    return for_study(study).server(config_id, read_json(Path(rdir) / ENGINE_JSON))


def benchmark(study: Study, config_id: str, rdir: Path, *, progress: bool = True,
              log: Callable[[str], None] | None = None, resume: bool = False) -> RunResult:
    """Run the study's workload against the configuration's server; returns RunResult."""
    rdir = Path(rdir)
    host = for_study(study)
    h = read_json(rdir / ENGINE_JSON)
    server = host.server(config_id, h)
    rss = RssWatcher(h["pid"]) if h.get("pid") else None
    if rss:
        rss.start()
    eng = resolve_profile(study, config_id)  # what launched: derived values (auto) filled in
    rec = base_record(study.study, config_id)
    rec["configuration"] = study.config(config_id).model_dump()
    rec["engine_params"] = eng.model_dump()
    rec["model"] = model_record(h.get("tokenizer_dir"), eng.load_format)
    gpus = engine_gpu_devices(eng.env)
    if gpus is not None:
        rec["gpus_used"] = gpus
    if host.engine_on_this_machine(h) and not rec["client_host"].get("gpus"):
        # the engine runs on this CPU: measure its memory bandwidth and matmul rate for the roofline
        from .measure.probe import measure_cpu_bandwidth

        rec["hardware_measured"] = measure_cpu_bandwidth(seconds=1.0)
    rec.update(_prediction(study, config_id, rec))

    def add_rss(record: dict[str, Any]) -> None:
        if rss:
            rss.stop()
            info = record.setdefault("server", {})
            info["peak_rss_bytes"] = max(rss.peak_bytes, info.get("peak_rss_bytes") or 0)

    kw = dict(study=study.study, config_id=config_id, record=rec, progress=progress, log=log, resume=resume,
              gpu_devices=[g["index"] for g in gpus] if gpus else None, before_final=add_rss)
    cap = study.capacity_for(config_id)
    if cap is not None:  # the search chooses the levels; each trial is an ordinary level
        from .measure.capacity import run_capacity_study

        return run_capacity_study(server, study.workload_for(config_id), rdir, cap, study.slo, **kw)
    return run_workload(server, study.workload_for(config_id), rdir, **kw)


def _prediction(study: Study, config_id: str, rec: dict[str, Any]) -> dict[str, Any]:
    """What the model facts and the hardware table predict, stored before the first request so
    it can never be fitted to the result it is compared with ({} when nothing is known)."""
    from .analysis.capacity import stored_prediction
    from .runfolder import now_iso

    try:
        pred = stored_prediction(rec, study.workload_for(config_id).buckets, study.slo, now_iso())
    except (KeyError, ValueError, TypeError, ZeroDivisionError) as e:  # a prediction never stops a run
        return {"prediction_error": f"{type(e).__name__}: {e}"}
    return {"prediction": pred} if pred else {}


# -- views the stage notebooks show ------------------------------------------------------------

def launch_plan(study: Study, config_id: str, python: str | None = None) -> str:
    """What `launch` will start or reach for this configuration (the dry-run lines): the engine
    command with its derived values, shell-quoted, in the host's words."""
    import shlex

    from .engines import build_command

    eng = resolve_profile(study, config_id)
    model = (eng.model.path or f"<model:{eng.model.preset}>") if eng.model else "<model>"
    return "\n".join(for_study(study).describe_config(config_id, shlex.join(build_command(eng, model, python))))


def level_plan(study: Study, config_id: str) -> pd.DataFrame:
    """The load levels `benchmark` will send: bucket, concurrency (or rate), rounds, requests."""
    from .measure.runner import levels, requests_per_round

    wl = study.workload_for(config_id)
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
    import shlex

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


def load_run(rdir: Path) -> RunFolder:
    """Everything one run folder holds, read from files only (lazily, once)."""
    return RunFolder(Path(rdir))


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


__all__ = ["provision", "launch", "benchmark", "run_dir", "launch_plan", "level_plan", "serve", "stop_served", "load_run", "HOST_JSON"]
