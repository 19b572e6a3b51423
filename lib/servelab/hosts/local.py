"""The local host: the engine runs here as a child process in its own process group (the
default study: vLLM's CPU build serving a model built offline)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..models import make_model
from ..runfolder import HOST_JSON, read_json, resolve, runs_root
from ..schema import EngineParams
from .base import Host, is_engine
from .process import Engine


def model_dir_for(eng: Any) -> str:
    """The model directory of an engine set-up: a preset built (or reused) offline, or a path
    that must hold config.json (relative paths from the repository root)."""
    assert eng.model is not None, "engine.model is needed to start an engine"
    if eng.model.preset:
        return str(make_model(eng.model.preset))
    p = resolve(eng.model.path or "")
    if not (p / "config.json").exists():
        raise FileNotFoundError(f"engine.model.path {p} has no config.json")
    return str(p.resolve())


def served_path(study_id: str, config_id: str) -> Path:
    """Where the handle of a server started for a configuration outside its stages lies: by the study runner
    on GPUs (`lanes`, shared by the configurations of one engine) or by `servelab serve`."""
    return runs_root() / study_id / ".served" / f"{config_id}.json"


class LocalHost(Host):
    kind = "local"
    kinds = ("local",)
    launches_engine = True
    side_by_side = True
    engine_here = True

    def _provision(self, config_id: str, rdir: Path, engine: EngineParams) -> dict[str, Any]:
        return {"model_dir": model_dir_for(engine)}

    def launch(self, config_id: str, rdir: Path, engine: EngineParams) -> dict[str, Any]:
        """Start the configuration's engine, or, where the study runner started its server already (a server
        shared by the configurations of one engine, on the GPUs the placement gave it), hand that one on. A
        server that is gone (it died, or the handle is an earlier run's) is started again for this configuration."""
        placed = served_path(self.study.study, config_id)
        if placed.exists():
            h = read_json(placed)
            if h.get("shared") and h.get("base_url", "").endswith(f":{engine.port}") and is_engine(h["pid"], {"info": h}):
                return {"mode": "launched", "base_url": h["base_url"], "model": h["model_dir"], "pid": h["pid"],
                        "shared": True, "info": {k: v for k, v in h.items() if k not in ("model_dir", "config")},
                        "tokenizer_dir": h["model_dir"]}
        host = read_json(rdir / HOST_JSON)
        eng = Engine(engine, host["model_dir"], rdir)  # derived values filled in
        eng.start()
        return {"mode": "launched", "base_url": eng.base_url, "model": eng.model_dir, "pid": eng.proc.pid,
                "info": eng.record(), "tokenizer_dir": eng.model_dir}

    def engine_on_this_machine(self, handle: dict[str, Any]) -> bool:
        return True
