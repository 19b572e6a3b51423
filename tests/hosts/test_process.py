"""Engine launcher: command building, and failures that end with a clear message, no orphans."""

from __future__ import annotations

import socket

import psutil
import pytest

from servelab.schema import EngineParams, ModelRef
from servelab.engines import build_command
from servelab.engines.flags import flag_args
from servelab.hosts.process import Engine, EngineError, redact_env

from conftest import CPU_ARGS, ENGINE_PORT, start_engine


def test_flag_args_forms():
    assert flag_args({"enforce-eager": True, "max_num_seqs": 4, "x": None, "y": False,
                      "compilation-config": {"mode": 0, "cudagraph_capture_sizes": [1, 2]}}) == [
        "--enforce-eager", "--max-num-seqs", "4",
        "--compilation-config", '{"mode":0,"cudagraph_capture_sizes":[1,2]}']


def test_build_command_vllm_and_sglang():
    p = EngineParams(kind="vllm", port=8123, args={"max-num-batched-tokens": 4096})
    cmd = build_command(p, "/m", python="py")
    assert cmd == ["py", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m", "--host", "127.0.0.1",
                   "--port", "8123", "--load-format", "dummy", "--max-num-batched-tokens", "4096"]
    s = build_command(EngineParams(kind="sglang", load_format=None, args={"tp-size": 4}), "/m", python="py")
    assert s[:4] == ["py", "-m", "sglang.launch_server", "--model-path"] and s[-2:] == ["--tp-size", "4"]


def test_redact_env():
    assert redact_env({"OPENAI_API_KEY": "sk-1", "HF_TOKEN": "x", "VLLM_X": "1"}) == {
        "OPENAI_API_KEY": "***", "HF_TOKEN": "***", "VLLM_X": "1"}


def test_port_in_use_is_refused_before_start(cpu_model_dir, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        eng = Engine(EngineParams(model=ModelRef(path=str(cpu_model_dir)), port=port), str(cpu_model_dir), tmp_path)
        with pytest.raises(EngineError, match=f"port {port} is already in use"):
            eng.start()
        assert eng.proc is None


@pytest.mark.engine
def test_bad_flag_ends_with_log_tail_and_no_orphans(cpu_model_dir, tmp_path):
    with pytest.raises(EngineError) as e:
        start_engine(cpu_model_dir, tmp_path, ENGINE_PORT + 2, **{"no-such-flag": 3})
    msg = str(e.value)
    assert "exited with status" in msg and "no-such-flag" in msg and str(tmp_path / "engine.log") in msg
    leftovers = [p for p in psutil.process_iter(["cmdline"]) if f"{ENGINE_PORT + 2}" in " ".join(p.info["cmdline"] or [])]
    assert leftovers == []


@pytest.mark.engine
def test_health_timeout_stops_the_engine(cpu_model_dir, tmp_path):
    p = EngineParams(model=ModelRef(path=str(cpu_model_dir)), port=ENGINE_PORT + 3, args=CPU_ARGS, startup_timeout_s=3)
    eng = Engine(p, str(cpu_model_dir), tmp_path)
    with pytest.raises(EngineError, match="not healthy after 3 s"):
        eng.start()
    assert not eng.alive()
    assert not psutil.pid_exists(eng.proc.pid) or psutil.Process(eng.proc.pid).status() == psutil.STATUS_ZOMBIE
