"""Shared fixtures: the reference server (known timings) and a real vLLM CPU server."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from servelab.schema import EngineParams, ModelRef
from servelab.hosts.process import Engine
from servelab.measure.refserver import Behaviour, RefServer



def free_port() -> int:
    """A port nothing listens on now (the OS picks it), so tests never collide with a server
    that already runs on this machine."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
    """One real vLLM CPU server for the whole session (prefix caching on, vLLM's default)."""
    eng = start_engine(cpu_model_dir, tmp_path_factory.mktemp("vllm"), ENGINE_PORT)
    yield eng
    eng.stop()
