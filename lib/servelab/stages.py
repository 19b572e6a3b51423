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
from pathlib import Path
from typing import Any, Callable

from .config import Study
from .engine import Engine, EngineError, Server, _RssWatcher, attach, log_tail
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
    else:
        assert study.host.attach is not None
        host["url"] = study.host.attach.url
    write_json(rdir / HOST_JSON, host)
    return host


def launch(study: Study, config_id: str, rdir: Path) -> dict[str, Any]:
    """Start the engine (local) or check the attached server; writes engine.json."""
    host = read_json(rdir / HOST_JSON)
    if study.host.kind == "attach":
        assert study.host.attach is not None
        srv = attach(study.host.attach)
        handle = {"mode": "attached", "base_url": srv.base_url, "model": srv.model, "info": srv.info,
                  "tokenizer_dir": srv.tokenizer_dir}
    else:
        eng = Engine(study.engine_for(config_id), host["model_dir"], rdir)
        eng.start()
        handle = {"mode": "launched", "base_url": eng.base_url, "model": eng.model_dir, "pid": eng.proc.pid,
                  "info": eng.record(), "tokenizer_dir": eng.model_dir}
    write_json(rdir / ENGINE_JSON, handle)
    return handle


def server_from_handle(rdir: Path, study: Study) -> Server:
    h = read_json(rdir / ENGINE_JSON)
    headers: dict[str, str] = {}
    if study.host.kind == "attach" and study.host.attach:
        headers = attach(study.host.attach).headers  # re-reads the key from the environment
    return Server(base_url=h["base_url"], model=h["model"], headers=headers, info=h["info"],
                  tokenizer_dir=h.get("tokenizer_dir"))


def benchmark(study: Study, config_id: str, rdir: Path, *, progress: bool = True,
              log: Callable[[str], None] = print) -> Any:
    """Run the study's workload against the configuration's server; returns RunResult."""
    from .runner import run_workload

    server = server_from_handle(rdir, study)
    h = read_json(rdir / ENGINE_JSON)
    rss = _RssWatcher(h["pid"]) if h.get("pid") else None
    if rss:
        rss.start()
    rec = base_record(study.study, config_id)
    rec["configuration"] = study.config(config_id).model_dump()
    rec["engine_params"] = study.engine_for(config_id).model_dump()
    rec["model"] = model_record(h.get("tokenizer_dir") if h["mode"] == "launched" else None)
    try:
        return run_workload(server, study.workload, rdir, study=study.study, config_id=config_id, record=rec,
                            progress=progress, log=log)
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
    pid = h.get("pid")
    if not pid:
        return "attached server left running"
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return "engine already stopped"
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            break
        _reap(pid)
        time.sleep(0.2)
    try:
        os.killpg(pid, signal.SIGKILL)
        _reap(pid)
        return "engine killed after grace period"
    except ProcessLookupError:
        return "engine stopped"


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


__all__ = ["provision", "launch", "benchmark", "stop", "run_dir", "EngineError", "log_tail"]
