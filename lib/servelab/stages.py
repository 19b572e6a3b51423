"""The pipeline stages of one configuration, as plain functions the notebooks call.

provision -> launch -> benchmark each read and write files in the run folder
`runs/<study>/<config>/`, so every stage can run in its own process (papermill executes one
notebook per stage): `launch` leaves the engine running in its own process group and writes
`engine.json`; `benchmark` reads it; `stop` ends the engine from that handle. Not for
diagnosis or the write-up (`diagnose`, `report`).
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .config import Study
from .engine import Engine, EngineError, Server, _RssWatcher, attach, log_tail, stop_process_group
from .records import RUN_JSON, read_json, write_json
from .runinfo import base_record, model_record

ENGINE_JSON = "engine.json"
HOST_JSON = "host.json"


def project_root(start: Path | None = None) -> Path:
    """The nearest folder upwards holding pyproject.toml (else the current folder)."""
    p = (start or Path.cwd()).resolve()
    for d in (p, *p.parents):
        if (d / "pyproject.toml").exists() and (d / "lib" / "servelab").exists():
            return d
    return Path.cwd().resolve()


def runs_root() -> Path:
    return Path(os.environ.get("SERVELAB_RUNS", project_root() / "runs"))


def run_dir(study: str, config_id: str, root: Path | None = None) -> Path:
    return Path(root or runs_root()) / study / config_id


def provision(study: Study, config_id: str, rdir: Path) -> dict[str, Any]:
    """Prepare the host: for a local host, build the model directory offline."""
    rdir.mkdir(parents=True, exist_ok=True)
    eng = study.engine_for(config_id)
    host: dict[str, Any] = {"kind": study.host.kind, "provisioned_at": time.time()}
    if study.host.kind == "local":
        assert eng.model is not None
        if eng.model.preset:
            from .modelmake import make_model

            host["model_dir"] = str(make_model(eng.model.preset))
        else:
            p = Path(eng.model.path or "")
            if not (p / "config.json").exists():
                raise FileNotFoundError(f"engine.model.path {p} has no config.json")
            host["model_dir"] = str(p.resolve())
    elif study.host.kind == "attach":
        assert study.host.attach is not None
        host["url"] = study.host.attach.url
    else:
        host.update(provision_aws(study, config_id))
    write_json(rdir / HOST_JSON, host)
    return host


def aws_state_path(study: Study) -> Path:
    return runs_root() / study.study / "aws-host.json"


def provision_aws(study: Study, config_id: str) -> dict[str, Any]:
    """Start the AWS host with this configuration's engine command, or switch the running one
    to it (a new task definition on the same instance). The host stays up for the next
    configuration; `stop_aws` ends it after the study, and on every failure."""
    from .aws import make_host
    from .engine import build_command
    from .profiles import resolve_profile

    assert study.host.aws is not None
    eng = resolve_profile(study, config_id)
    model = (eng.model.path or eng.model.preset) if eng.model else ""
    cmd = build_command(eng, str(model), python="python3")
    h = make_host(study.host.aws)
    state = aws_state_path(study)
    if state.exists():
        prev = read_json(state)
        h.region, h.started_at = prev["region"], prev["started_at"]
        h.guard()  # stops the host and raises once max_hours / max_spend_usd is reached
        info = h.deploy(cmd, dict(eng.env))
    else:
        info = h.start(cmd, dict(eng.env))
        write_json(state, {"region": info.region, "started_at": info.started_at, "config": config_id})
    return {"aws": info.record(), "url": info.url, "tunnel": info.tunnel, "command": cmd}


def stop_aws(study: Study) -> str:
    """Stop the study's AWS host (idempotent); called after the study and on failure."""
    from .aws import make_host

    if study.host.aws is None:
        return "no AWS host"
    state = aws_state_path(study)
    region = read_json(state)["region"] if state.exists() else None
    out = make_host(study.host.aws).stop(region)
    state.unlink(missing_ok=True)
    return f"AWS host stopped: {out}"


def launch(study: Study, config_id: str, rdir: Path) -> dict[str, Any]:
    """Start the engine (local) or check the attached server; writes engine.json."""
    host = read_json(rdir / HOST_JSON)
    if study.host.kind == "attach":
        assert study.host.attach is not None
        srv = attach(study.host.attach)
        info = dict(srv.info)
        served = served_path(study.study, config_id)
        if served.exists():  # started by `servelab serve`: keep its command, env, start-up time
            info["served"] = read_json(served)
            info["command"] = info["served"].get("command")
            info["startup_s"] = info["served"].get("startup_s")
            info["env"] = info["served"].get("env")
        handle = {"mode": "attached", "base_url": srv.base_url, "model": srv.model, "info": info,
                  "tokenizer_dir": srv.tokenizer_dir or (info.get("served") or {}).get("model_dir")}
    elif study.host.kind.startswith("aws"):
        handle = launch_aws(study, host)
    else:
        eng = Engine(study.engine_for(config_id), host["model_dir"], rdir)
        eng.start()
        handle = {"mode": "launched", "base_url": eng.base_url, "model": eng.model_dir, "pid": eng.proc.pid,
                  "info": eng.record(), "tokenizer_dir": eng.model_dir}
    handle["info"]["smoke_check"] = smoke(study, config_id, handle)
    write_json(rdir / ENGINE_JSON, handle)
    return handle


def smoke(study: Study, config_id: str, handle: dict[str, Any]) -> dict[str, Any]:
    """Seed 000's functional check: a chat reply and, with a tool-call parser, a tool call.
    With dummy weights the answers are recorded but the check does not apply."""
    from .profiles import smoke_check

    eng = study.engine_for(config_id)
    headers = client_headers(study, config_id, handle["mode"])
    # servelab knows the weights only of an engine it started (here, via serve, or on AWS)
    ours = handle["mode"] in ("launched", "aws") or bool(handle["info"].get("served"))
    try:
        return smoke_check(handle["base_url"], handle["model"], headers,
                           tool_call=bool(eng.args.get("tool-call-parser")),
                           dummy_weights=ours and eng.load_format == "dummy", max_tokens=16)
    except Exception as e:  # the check is a record, never a reason to stop the measurement
        return {"applies": None, "ok": False, "reason": f"smoke check failed: {type(e).__name__}: {e}"}


def served_path(study_id: str, config_id: str) -> Path:
    """Where `servelab serve` leaves the handle of an engine it started for an attach study."""
    return runs_root() / study_id / ".served" / f"{config_id}.json"


def serve(study: Study, config_id: str, *, port: int | None = None, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Start the configuration's engine detached (for studies whose host attaches to it) and
    wait for /health. Writes the handle that `launch` and `stop_served` read."""
    eng_p = study.engine_for(config_id)
    if port or env:
        eng_p = eng_p.model_copy(update={"port": port or eng_p.port, "env": {**eng_p.env, **(env or {})}})
    assert eng_p.model is not None, "engine.model is needed to serve"
    if eng_p.model.preset:
        from .modelmake import make_model

        model_dir = str(make_model(eng_p.model.preset))
    else:
        model_dir = str(eng_p.model.path)
    p = served_path(study.study, config_id)
    p.parent.mkdir(parents=True, exist_ok=True)
    eng = Engine(eng_p, model_dir, p.parent / config_id)
    eng.start()
    handle = {**eng.record(), "model_dir": model_dir, "config": config_id}
    write_json(p, handle)
    return handle


def stop_served(study_id: str, config_id: str) -> str:
    p = served_path(study_id, config_id)
    if not p.exists():
        return "no served engine"
    h = read_json(p)
    if not h.get("pid") or not _is_engine(h["pid"], {"info": h}):
        return "engine already stopped"
    return stop_process_group(h["pid"])


def launch_aws(study: Study, host: dict[str, Any]) -> dict[str, Any]:
    """Reach the engine the AWS host runs: through the SSM port forward when there is one."""
    from .aws import open_tunnel
    from .config import AttachParams

    url, tunnel_pid = host.get("url"), None
    if host.get("tunnel"):
        assert study.host.aws is not None
        port = study.host.aws.local_port
        tunnel_pid = open_tunnel(host["tunnel"], port).pid
        url = f"http://127.0.0.1:{port}"
    srv = attach(AttachParams(url=url))
    info = {**srv.info, "command": host.get("command"), "aws": host.get("aws")}
    return {"mode": "aws", "base_url": srv.base_url, "model": srv.model, "info": info, "tokenizer_dir": None,
            "tunnel_pid": tunnel_pid}


def client_headers(study: Study, config_id: str, mode: str) -> dict[str, str]:
    """Headers the client sends: the attach block's (key re-read from the environment), or the
    API key of an engine servelab launched with engine.api_key_env."""
    from .engine import auth_headers

    if study.host.kind == "attach" and study.host.attach:
        return attach(study.host.attach).headers
    return auth_headers(study.engine_for(config_id).api_key_env) if mode == "launched" else {}


def server_from_handle(rdir: Path, study: Study, config_id: str) -> Server:
    h = read_json(rdir / ENGINE_JSON)
    return Server(base_url=h["base_url"], model=h["model"], headers=client_headers(study, config_id, h["mode"]),
                  info=h["info"],
                  tokenizer_dir=h.get("tokenizer_dir"))


def benchmark(study: Study, config_id: str, rdir: Path, *, progress: bool = True,
              log: Callable[[str], None] = print, resume: bool = False) -> Any:
    """Run the study's workload against the configuration's server; returns RunResult."""
    from .runner import run_workload

    server = server_from_handle(rdir, study, config_id)
    h = read_json(rdir / ENGINE_JSON)
    rss = _RssWatcher(h["pid"]) if h.get("pid") else None
    if rss:
        rss.start()
    rec = base_record(study.study, config_id)
    rec["configuration"] = study.config(config_id).model_dump()
    rec["engine_params"] = study.engine_for(config_id).model_dump()
    rec["model"] = model_record(h.get("tokenizer_dir"))
    if h["mode"] == "launched" and not rec["client_host"].get("gpus"):
        # the engine runs on this CPU: measure its memory bandwidth and matmul rate for the roofline
        from .hardware import measure_cpu_bandwidth

        rec["hardware_measured"] = measure_cpu_bandwidth(seconds=1.0)
    try:
        return run_workload(server, study.workload_for(config_id), rdir, study=study.study, config_id=config_id, record=rec,
                            progress=progress, log=log, resume=resume)
    finally:
        if rss:
            rss.stop()
            info = rec.get("server", {})
            info["peak_rss_bytes"] = max(rss.peak_bytes, info.get("peak_rss_bytes") or 0)
            if (rdir / RUN_JSON).exists():
                full = read_json(rdir / RUN_JSON)
                full.setdefault("server", {})["peak_rss_bytes"] = info["peak_rss_bytes"]
                write_json(rdir / RUN_JSON, full)


def stop(rdir: Path, grace_s: float = 20.0) -> str:
    """Stop a launched engine from its handle (whole process group). Safe to call twice."""
    p = rdir / ENGINE_JSON
    if not p.exists():
        return "no engine handle"
    h = read_json(p)
    if h.get("tunnel_pid"):
        try:
            os.killpg(h["tunnel_pid"], signal.SIGTERM)
        except ProcessLookupError:
            pass
    pid = h.get("pid")
    if not pid:
        return "attached server left running"
    if not _is_engine(pid, h):
        return "engine already stopped"
    return stop_process_group(pid, grace_s)


def _is_engine(pid: int, handle: dict[str, Any]) -> bool:
    """True when `pid` still runs the engine of this handle (guards against pid reuse)."""
    import psutil

    try:
        cmd = psutil.Process(pid).cmdline()
    except psutil.Error:
        return False
    want = (handle.get("info") or {}).get("command") or []
    return bool(cmd) and cmd[:3] == want[:3]


# -- views the stage notebooks show ------------------------------------------------------------

def model_facts_table(host: dict[str, Any]) -> Any:
    """Architecture facts of the provisioned model as a two-column table (empty for attach)."""
    import pandas as pd

    if not host.get("model_dir"):
        return pd.DataFrame({"fact": ["url"], "value": [host.get("url")]})
    from .modelmake import model_facts

    f = model_facts(Path(host["model_dir"]))
    return pd.DataFrame({"fact": list(f), "value": [str(v) for v in f.values()]})


def launch_table(handle: dict[str, Any]) -> Any:
    import pandas as pd

    info = handle.get("info", {})
    rows = {"mode": handle.get("mode"), "base_url": handle.get("base_url"), "model": handle.get("model"),
            "version": info.get("version"),
            "startup_s": f"{info['startup_s']:.1f}" if info.get("startup_s") else None,
            "command": " ".join(info.get("command") or [])}
    return pd.DataFrame({"": list(rows), "value": list(rows.values())})


def summary_table(summary: Any) -> Any:
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


@dataclass
class RunData:
    run_dir: Path
    records: Any
    summary: Any
    run: dict[str, Any]
    samples: Any


def load_run(rdir: Path) -> RunData:
    """Everything one run folder holds, read from files only."""
    from .metrics import load_samples
    from .records import SERVER_METRICS, load_records
    from .summary import summarize

    recs = load_records(rdir)
    samples = load_samples(rdir / SERVER_METRICS) if (rdir / SERVER_METRICS).exists() else None
    run = read_json(rdir / RUN_JSON) if (rdir / RUN_JSON).exists() else {}
    return RunData(rdir, recs, summarize(recs), run, samples)


def server_metrics_table(run: RunData) -> Any:
    """Per level: peak KV usage, running, waiting and the preemptions counted during it."""
    import pandas as pd

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


__all__ = ["provision", "launch", "benchmark", "stop", "run_dir", "EngineError", "log_tail"]
