"""Start, watch and stop an engine process, and the `Server` a client sends requests to.

`Engine` builds the command line through the engine's profile, starts it in its own process
group with its log in the run folder, waits for `/health` with a deadline, and records what a
reproducibility record needs (command, env, version, startup time, peak RSS). `Engine.stop()`
and `stop_process_group` end the whole process group, so no worker is orphaned. Not for
building model directories (`models`) or sending load (`measure`).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from ..schema import EngineParams
from ..secrets import SECRET_NAME, scrub
from ..engines import get
from ..errors import ServelabError
from ..models import default_cache_root

LOG_TAIL_LINES = 30


def user_config_path() -> Path:
    """servelab's user config: $XDG_CONFIG_HOME/servelab/config.yaml (default ~/.config/servelab/config.yaml)."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "servelab" / "config.yaml"


def engine_python(p: EngineParams) -> str | None:
    """The Python an engine starts with: `engine.python`, else $SERVELAB_<KIND>_PYTHON, else the user config's
    `engines.<kind>.python`, else None (servelab's own). A virtualenv's folder stands for its bin/python.
    EngineError when the one named does not exist."""
    import yaml  # only where an engine starts

    name, where = p.python, "engine.python"
    if not name and os.environ.get(f"SERVELAB_{p.kind.upper()}_PYTHON"):
        name, where = os.environ[f"SERVELAB_{p.kind.upper()}_PYTHON"], f"SERVELAB_{p.kind.upper()}_PYTHON"
    cfg = user_config_path()
    if not name and cfg.exists():
        try:
            name = ((yaml.safe_load(cfg.read_text()) or {}).get("engines") or {}).get(p.kind, {}).get("python")
        except (yaml.YAMLError, AttributeError) as e:
            raise EngineError(f"{cfg}: expected `engines: {{{p.kind}: {{python: PATH}}}}`: {e}") from None
        where = str(cfg)
    if not name:
        return None
    path = Path(name).expanduser()
    if path.is_dir():
        path = path / "bin" / "python"
    if not path.exists():
        raise EngineError(f"{where}: {path} does not exist (the {p.kind} engine's Python)")
    return str(path)


def engine_env(p: EngineParams) -> dict[str, str]:
    """The engine's whole environment: ours, the profile's additions, a project-owned compile
    cache and a short TMPDIR (the engine binds ZeroMQ IPC sockets there: path limit 107
    bytes), then `engine.env`; the API key of `engine.api_key_env` the profile's way."""
    prof = get(p.kind)
    env = dict(os.environ)
    extra = prof.environment(p)
    base = default_cache_root().parent
    cache, tmp = base / "vllm", base / "tmp" / str(p.port)
    cache.mkdir(parents=True, exist_ok=True)
    tmp.mkdir(parents=True, exist_ok=True)
    extra.setdefault("VLLM_CACHE_ROOT", str(cache))
    extra.setdefault("TMPDIR", str(tmp))
    extra.update(p.env)
    if p.api_key_env:
        key = os.environ.get(p.api_key_env)
        if not key:
            raise EngineError(f"environment variable {p.api_key_env} (engine.api_key_env) is not set")
        extra.update(prof.api_key_env(key))
    env.update(extra)
    return env


class EngineError(ServelabError, RuntimeError):
    """The engine could not be started or died; the message ends with the log tail."""


def redact_env(env: dict[str, str]) -> dict[str, str]:
    return {k: ("***" if SECRET_NAME.search(k) else v) for k, v in env.items()}


def log_tail(path: Path, n: int = LOG_TAIL_LINES) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no engine log)"
    return scrub("\n".join(lines[-n:]))


def _port_in_use(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host if host != "0.0.0.0" else "127.0.0.1", port)) == 0


@dataclass
class Server:
    """Where to send requests, with what headers, and what we know about the server."""

    base_url: str
    model: str
    headers: dict[str, str] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    tokenizer_dir: str | None = None


def tree_rss_bytes(pid: int) -> int:
    """Resident memory of a process and all its children now (0 when it is gone)."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


class RssWatcher(threading.Thread):
    """Samples the resident memory of a process tree; keeps the peak."""

    def __init__(self, pid: int, interval_s: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.pid, self.interval_s, self.peak_bytes = pid, interval_s, 0
        self._stop = threading.Event()

    def run(self) -> None:
        if not psutil.pid_exists(self.pid):
            return
        while not self._stop.is_set():
            self.peak_bytes = max(self.peak_bytes, tree_rss_bytes(self.pid))
            self._stop.wait(self.interval_s)

    def stop(self) -> None:
        self._stop.set()


class Engine:
    """A running engine child process. Use as a context manager so it always stops."""

    def __init__(self, params: EngineParams, model_dir: str, workdir: Path) -> None:
        self.params = params
        self.model_dir = model_dir
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.workdir / "engine.log"
        self.profile = get(params.kind)
        self.python = engine_python(params)
        self.command = self.profile.command(params, model_dir, self.python)
        self.env = engine_env(params)
        self.proc: subprocess.Popen[bytes] | None = None
        self.startup_s: float | None = None
        self.version: str | None = None
        self._rss: RssWatcher | None = None
        self.base_url = f"http://{'127.0.0.1' if params.host == '0.0.0.0' else params.host}:{params.port}"

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> "Engine":
        if _port_in_use(self.params.host, self.params.port):
            raise EngineError(f"port {self.params.port} is already in use on {self.params.host}: "
                              "stop the other server or set engine.port")
        t0 = time.monotonic()
        log = open(self.log_path, "ab")
        log.write(f"# servelab: {' '.join(self.command)}\n".encode())
        log.flush()
        self.proc = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                     cwd=self.workdir, start_new_session=True)
        log.close()
        self._rss = RssWatcher(self.proc.pid)
        self._rss.start()
        try:
            self._wait_healthy(t0 + self.params.startup_timeout_s)
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - t0
        self.server_info = self.profile.server_info(self.base_url, auth_headers(self.params.api_key_env))
        self.version = self.profile.version(self.server_info)
        return self

    def _wait_healthy(self, deadline: float) -> None:
        assert self.proc is not None
        with httpx.Client(timeout=2.0) as c:
            while True:
                code = self.proc.poll()
                if code is not None:
                    raise EngineError(f"engine exited with status {code} before it was healthy; "
                                      f"log {self.log_path}:\n{log_tail(self.log_path)}")
                try:
                    if c.get(self.base_url + "/health").status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise EngineError(f"engine not healthy after {self.params.startup_timeout_s:g} s "
                                      f"(engine.startup_timeout_s); log {self.log_path}:\n{log_tail(self.log_path)}")
                time.sleep(0.5)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, grace_s: float = 20.0) -> int | None:
        """Stop the whole process group (see stop_process_group). Returns the exit status."""
        if self._rss:
            self._rss.stop()
        if self.proc is None:
            return None
        stop_process_group(self.proc.pid, grace_s, self.proc)
        return self.proc.poll()

    def __enter__(self) -> "Engine":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @property
    def peak_rss_bytes(self) -> int | None:
        return self._rss.peak_bytes if self._rss else None

    def server(self) -> Server:
        return Server(base_url=self.base_url, model=self.model_dir, info=self.record(),
                      tokenizer_dir=self.model_dir, headers=auth_headers(self.params.api_key_env))

    def record(self) -> dict[str, Any]:
        """What run.json keeps about the engine."""
        return {
            "mode": "launched",
            "engine": self.params.kind,
            "version": self.version,
            "command": self.command,
            "env": redact_env({k: v for k, v in self.env.items() if k in self.params.env or self.profile.env_to_record(k)}),
            "startup_s": self.startup_s,
            "peak_rss_bytes": self.peak_rss_bytes,
            "log": str(self.log_path),
            "base_url": self.base_url,
            "pid": self.proc.pid if self.proc else None,
        }


def stop_process_group(pgid: int, grace_s: float = 20.0, proc: subprocess.Popen[bytes] | None = None) -> str:
    """SIGTERM a process group, wait until every member is gone, SIGKILL what is left after
    `grace_s`. The leader is reaped when it is our child (`proc`, or found by waitpid), so a
    zombie leader does not keep the group alive. Safe on a group that is already gone."""

    def reap() -> None:
        if proc is not None:
            proc.poll()
        else:
            try:
                os.waitpid(pgid, os.WNOHANG)
            except ChildProcessError:
                pass

    def gone(wait_s: float) -> bool:
        deadline = time.monotonic() + wait_s
        while True:
            reap()
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)

    for sig, wait_s, done in ((signal.SIGTERM, grace_s, "engine stopped"),
                              (signal.SIGKILL, 10.0, "engine killed after grace period")):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return "engine already stopped" if sig == signal.SIGTERM else "engine stopped"
        if gone(wait_s):
            return done
    return f"process group {pgid} did not exit after SIGKILL"


def auth_headers(api_key_env: str | None) -> dict[str, str]:
    """Authorization header from the named environment variable (none if not set)."""
    key = os.environ.get(api_key_env) if api_key_env else None
    return {"Authorization": f"Bearer {key}"} if key else {}
