"""The host interface: where a configuration's engine runs, and everything the pipeline does
differently for a local process, an attached server and an AWS GPU host.

A `Host` is made once per study run (`servelab.hosts.for_study`) and serves every
configuration, each handed to it resolved (`plan.ConfigPlan.engine`):
`provision` prepares what the engine needs (host.json), `launch` starts or reaches the engine
and returns its handle (engine.json), `stop` ends one configuration's engine, `teardown`
ends everything the study started (AWS: scale to zero), `guard` holds for the whole run
(AWS: the spend/time watchdog and a deadline AWS enforces itself). Code outside `hosts/`
never branches on `host.kind`. `Server` is where the client sends requests.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import psutil

from ..runfolder import ENGINE_JSON, HOST_JSON, read_engine, runs_root, write_json
from ..schema import EngineParams, Study
from .process import Server, auth_headers, stop_process_group  # noqa: F401  (Server: where a client sends)


class Host:
    """Base of the hosts; `kind` is the params' `host.kind`."""

    kind = ""
    #: the `host.kind` values this class serves (the registry's keys, servelab.hosts.HOSTS)
    kinds: tuple[str, ...] = ()
    #: servelab starts the engine itself (so it knows the weights: the smoke check's dummy rule)
    launches_engine = False
    #: several engines of one study may run here at once (measured interleaved: measure.interleave)
    side_by_side = False
    #: what the cost section prices: "local" (nothing billed), "instance" (hours), "endpoint" (tokens)
    cost_basis = "local"
    #: the engine runs on this machine's own hardware (a prediction's machine is this CPU)
    engine_here = False
    #: the whole study runs elsewhere with this same runner (`run_there`: an AWS instance, `runner: instance`)
    runs_remotely = False

    def __init__(self, study: Study) -> None:
        self.study = study

    # -- per configuration ----------------------------------------------------------------
    def provision(self, config_id: str, rdir: Path, engine: EngineParams) -> dict[str, Any]:
        """Prepare the host for one configuration whose resolved engine set-up (derived values
        applied: plan.ConfigPlan.engine) is `engine`; returns (and writes) host.json."""
        rdir.mkdir(parents=True, exist_ok=True)
        host = {"kind": self.kind, **self._provision(config_id, rdir, engine)}
        write_json(rdir / HOST_JSON, host)
        return host

    def _provision(self, config_id: str, rdir: Path, engine: EngineParams) -> dict[str, Any]:
        return {}

    def launch(self, config_id: str, rdir: Path, engine: EngineParams) -> dict[str, Any]:
        """Start or reach the engine `engine` (resolved); returns the handle written to engine.json."""
        raise NotImplementedError

    def stop(self, rdir: Path, grace_s: float = 20.0) -> str:
        """Stop one configuration's engine from its handle. Safe to call twice."""
        p = rdir / ENGINE_JSON
        if not p.exists():
            return "no engine handle"
        h = read_engine(p)
        if h.get("shared"):
            return "server kept: the study runner stops it after its last configuration"
        if h.get("tunnel_pid"):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(h["tunnel_pid"], signal.SIGTERM)
        pid = h.get("pid")
        if not pid:
            return "attached server left running"
        if not is_engine(pid, h):
            return "engine already stopped"
        return stop_process_group(pid, grace_s)

    def client_headers(self, config_id: str, handle: dict[str, Any]) -> dict[str, str]:
        """Headers the client sends: the API key of an engine servelab launched."""
        return auth_headers(self.study.engine_for(config_id).api_key_env) if handle.get("pid") else {}

    def server(self, config_id: str, handle: dict[str, Any]) -> Server:
        return Server(base_url=handle["base_url"], model=handle["model"],
                      headers=self.client_headers(config_id, handle), info=handle["info"],
                      tokenizer_dir=handle.get("tokenizer_dir"))

    def weights_known(self, handle: dict[str, Any]) -> bool:
        """Whether servelab chose the engine's weights (so `load_format: dummy` is known)."""
        return self.launches_engine

    def engine_on_this_machine(self, handle: dict[str, Any]) -> bool:
        """Whether the engine shares this machine (its CPU is then measured for the roofline)."""
        return False

    # -- per study ------------------------------------------------------------------------
    def check(self) -> None:
        """Refuse early (before any configuration) when the host cannot work, e.g. a URL that
        does not answer."""

    @contextlib.contextmanager
    def guard(self) -> Iterator[None]:
        """Held for the whole run (every configuration)."""
        yield

    def teardown(self) -> str | None:
        """End everything the study started on this host (every path: success, failure, signal)."""
        return None

    def describe_config(self, config_id: str, command: str) -> list[str]:
        """The dry-run lines of one configuration (its shell-quoted engine command)."""
        return [f"[{config_id}] launch: {command}"]

    def plan_lines(self, engines: Mapping[str, EngineParams]) -> list[str]:
        """What `--dry-run` prints about this host (no call to anything), given each
        configuration's resolved engine set-up ({config id: EngineParams})."""
        return []

    def state_path(self) -> Path:
        return runs_root() / self.study.study / f"{self.kind}-host.json"


def is_engine(pid: int, handle: dict[str, Any]) -> bool:
    """True when `pid` still runs the engine of this handle (guards against pid reuse)."""
    try:
        cmd = psutil.Process(pid).cmdline()
    except psutil.Error:
        return False
    want = (handle.get("info") or {}).get("command") or []
    # an engine started through a script (a virtualenv's wrapper with a #! line) shows its interpreter first
    return bool(cmd) and bool(want) and (cmd[:3] == want[:3] or cmd[1:4] == want[:3])
