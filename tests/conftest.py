"""Shared fixtures: the reference server (known timings) and a real vLLM CPU server."""

from __future__ import annotations

import os
from pathlib import Path

import psutil
import pytest

from servelab.schema import EngineParams, ModelRef
from servelab.hosts.process import Engine
from servelab.measure.refserver import Behaviour, RefServer

import leftovers

_TOKEN = pytest.StashKey[tuple]()


def pytest_sessionstart(session: pytest.Session) -> None:
    """Mark every process this session will start (see tests/leftovers.py)."""
    session.config.stash[_TOKEN] = (leftovers.mark_session(), set(psutil.pids()))


# The files that take longest (a fresh clone's CI, 2026-12-06), started first: xdist hands a worker one file at a
# time in collection order, and the README's (its `servelab report --all` alone ~300 s) started after the analysis
# and benchmark files ended that pass about a minute after every other worker had finished.
LONGEST_FIRST = ("tests/e2e/test_readme.py", "tests/test_bench.py", "tests/benchmarks/test_smoke_p_to_z.py",
                 "tests/measure/test_capacity.py", "tests/analysis/test_verdicts.py", "tests/measure/test_ray_pool.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Longest files first (`LONGEST_FIRST`), the rest in their order: the same tests, a shorter parallel pass."""
    rank = {f: i for i, f in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda it: rank.get(it.nodeid.split("::")[0], len(rank)))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """After every fixture's teardown: fail the session if a process it started is still alive."""
    token, before = session.config.stash[_TOKEN]
    left = leftovers.leftovers(token, before)
    if left:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        msg = f"{len(left)} processes started by this test session were still alive after it (now killed):"
        if reporter:
            reporter.write_line(msg, red=True)
            for line in left:
                reporter.write_line(f"  {line}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def free_port() -> int:
    """A port nothing listens on now (the OS picks it), so tests never collide with a server
    that already runs on this machine."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_ports(n: int) -> int:
    """The first of `n` consecutive ports nothing listens on now: the GPU runner gives a study's servers the
    engine's port and the ones after it (a taken port+1 failed a test now and then under xdist)."""
    import socket

    for _ in range(100):
        base = free_port()
        socks = []
        try:
            for p in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no {n} consecutive free ports")


ENGINE_PORT = int(os.environ.get("SERVELAB_TEST_PORT") or free_port())

# Flags of docs/cpu-engine.md, sized for tests.
CPU_ARGS = {"enforce-eager": True, "dtype": "bfloat16", "max-model-len": 4096, "max-num-seqs": 64,
            "block-size": 32, "kv-cache-memory-bytes": "256M"}


@pytest.fixture
def refserver():
    """Factory: refserver(ttft_s=..., itl_s=...) -> started RefServer, stopped at teardown."""
    started: list[RefServer] = []

    def make(**kw) -> RefServer:
        s = RefServer(Behaviour(**kw)).start()
        started.append(s)
        return s

    yield make
    for s in started:
        s.stop()


@pytest.fixture(scope="session")
def cpu_model_dir() -> Path:
    from servelab.models import make_model

    return make_model("cpu-tiny")


@pytest.fixture(scope="session")
def real_model_dir() -> Path:
    """SmolLM2-135M-Instruct with real weights (built once into the servelab cache, ~1 min)."""
    from servelab.models import make_model

    return make_model("smollm2-135m")


def start_engine(model_dir: Path, workdir: Path, port: int, load_format: str | None = "dummy",
                 startup_timeout_s: float = 300, **extra_args) -> Engine:
    params = EngineParams(kind="vllm", model=ModelRef(path=str(model_dir)), port=port,
                          args={**CPU_ARGS, **extra_args}, startup_timeout_s=startup_timeout_s,
                          load_format=load_format)
    return Engine(params, str(model_dir), workdir).start()


@pytest.fixture(scope="session")
def vllm_engine(cpu_model_dir, tmp_path_factory):
    """One real vLLM CPU server for the whole session (prefix caching on, vLLM's default; cached
    tokens in the usage, for the workload-source tests)."""
    eng = start_engine(cpu_model_dir, tmp_path_factory.mktemp("vllm"), ENGINE_PORT,
                       **{"enable-prompt-tokens-details": True})
    yield eng
    eng.stop()


@pytest.fixture(scope="session")
def readme_commands(tmp_path_factory):
    """The README's blocks that need no server (`readme-commands`), run once for the session as a new user types
    it (it renders every published study): (folder of its runs and reports, the pages after each
    `servelab report` line). tests/e2e/test_readme.py checks the commands and that every re-rendered
    page is the committed one (one file: `--dist loadfile` gives a file to one worker, so the block
    runs once)."""
    import readme

    base = tmp_path_factory.mktemp("readme")
    env = readme.environment(base)
    return base, readme.run_lines(readme.block("readme-commands"), env)

