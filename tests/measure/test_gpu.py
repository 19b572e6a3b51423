"""GpuSampler, gpu_facts and energy_per_level against a fake pynvml (known power, energy and
memory) and a fake nvidia-smi; no GPU needed. Fast (about 3 s)."""

from __future__ import annotations

import asyncio
import json
import sys
import textwrap
import time
import types

import pandas as pd
import pytest

from servelab.measure import gpu
from servelab.measure.gpu import GpuSampler, energy_per_level, engine_devices, gpu_facts, load_gpu_samples

POWER_W = 500.0
MEM_TOTAL = 141 * 2**30
MEM_USED = 80 * 2**30


def fake_pynvml(n_devices: int = 2, energy: bool = True) -> types.ModuleType:
    """NVML with n H200s drawing 500 W each; the energy counter grows 500 J/s from nvmlInit."""
    nv = types.ModuleType("pynvml")
    state = {"t0": None, "inits": 0, "shutdowns": 0}

    class NVMLError(Exception):
        pass

    def init():
        state["t0"] = time.perf_counter()
        state["inits"] += 1

    def total_energy(h):
        if not energy:
            raise NVMLError("Not Supported")
        return int((time.perf_counter() - state["t0"]) * POWER_W * 1000)  # mJ

    nv.NVMLError = NVMLError
    nv.NVML_CLOCK_SM = 1
    nv.state = state
    nv.nvmlInit = init
    nv.nvmlShutdown = lambda: state.__setitem__("shutdowns", state["shutdowns"] + 1)
    nv.nvmlDeviceGetCount = lambda: n_devices
    nv.nvmlDeviceGetHandleByIndex = lambda i: ("h", i)
    nv.nvmlDeviceGetName = lambda h: "NVIDIA H200"
    nv.nvmlDeviceGetUUID = lambda h: f"GPU-0000000{h[1]}-aaaa-bbbb-cccc-dddddddddddd"
    nv.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=90 + h[1], memory=40)
    nv.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=MEM_TOTAL, used=MEM_USED,
                                                                 free=MEM_TOTAL - MEM_USED)
    nv.nvmlDeviceGetPowerUsage = lambda h: int(POWER_W * 1000)  # mW
    nv.nvmlDeviceGetTotalEnergyConsumption = total_energy
    nv.nvmlDeviceGetClockInfo = lambda h, kind: 1980
    nv.nvmlSystemGetDriverVersion = lambda: "580.95.05"
    nv.nvmlDeviceGetPowerManagementLimit = lambda h: 700_000
    return nv


def records(levels: dict[str, tuple[str, int, int, int]]) -> pd.DataFrame:
    """label -> (bucket, concurrency, ok requests, output tokens each); plus one failed request each."""
    rows = []
    for bucket, c, n, tok in levels.values():
        rows += [{"bucket": bucket, "concurrency": c, "rate_rps": 0.0, "warmup": False, "ok": True,
                  "output_tokens": tok} for _ in range(n)]
        rows.append({"bucket": bucket, "concurrency": c, "rate_rps": 0.0, "warmup": False, "ok": False,
                     "output_tokens": None})
    return pd.DataFrame(rows)


@pytest.fixture
def nvml(monkeypatch):
    nv = fake_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    return nv


def test_nvml_sampler_levels_energy_and_j_per_token(nvml, tmp_path):
    path = tmp_path / "gpu_metrics.jsonl"
    with GpuSampler(path, interval_s=0.1) as g:
        assert g.available is True and g.backend == "nvml"
        g.set_level("in256-out64 c=1")
        time.sleep(0.25)
        g.set_level("in256-out64 c=4")
        time.sleep(0.3)
    assert nvml.state["shutdowns"] == 1
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert {ln["index"] for ln in lines} == {0, 1}
    assert all(ln["power_w"] == POWER_W and ln["mem_used_bytes"] == MEM_USED and ln["sm_clock_mhz"] == 1980
               for ln in lines)
    assert {ln["level"] for ln in lines} == {None, "in256-out64 c=1", "in256-out64 c=4"}
    assert lines[0]["level"] is None and lines[-1]["level"] == "in256-out64 c=4"
    assert sum(ln["level"] == "in256-out64 c=1" for ln in lines) >= 4  # >= 2 ticks x 2 GPUs at 10 Hz

    df = load_gpu_samples(path)
    assert df.attrs["available"] and len(df) == len(lines)
    rec = records({"a": ("in256-out64", 1, 3, 64), "b": ("in256-out64", 4, 5, 64)})
    e = energy_per_level(df, rec).set_index("level")
    assert list(e.index) == ["in256-out64 c=1", "in256-out64 c=4"]
    for lab, tokens in (("in256-out64 c=1", 3 * 64), ("in256-out64 c=4", 5 * 64)):
        row = e.loc[lab]
        assert row["energy_method"] == "counter" and row["gpus"] == 2
        assert row["duration_s"] > 0.15
        # two GPUs at 500 W: 1000 J/s over the level's window
        assert row["energy_j"] == pytest.approx(2 * POWER_W * row["duration_s"], rel=0.05)
        assert row["power_w_mean"] == pytest.approx(1000.0) and row["power_w_max"] == pytest.approx(1000.0)
        assert row["output_tokens"] == tokens and row["requests_ok"] == tokens // 64
        assert row["j_per_output_token"] == pytest.approx(row["energy_j"] / tokens, rel=0.05)
        assert row["mem_used_gib_max"] == pytest.approx(160.0)
        assert row["gpu_util_pct_mean"] == pytest.approx(90.5)


def test_power_integral_when_no_energy_counter_and_device_filter(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(n_devices=2, energy=False))
    path = tmp_path / "g.jsonl"
    with GpuSampler(path, interval_s=0.1, devices=[1]) as g:
        g.set_level("x c=1")
        time.sleep(0.35)
    df = load_gpu_samples(path)
    assert set(df["index"]) == {1.0} and df["energy_mj"].isna().all()
    row = energy_per_level(df, None).iloc[0]
    assert row["energy_method"] == "power_integral" and row["gpus"] == 1
    assert row["energy_j"] == pytest.approx(POWER_W * row["duration_s"], rel=1e-6)
    assert row["output_tokens"] == 0 and pd.isna(row["j_per_output_token"])


def test_async_context_manager(nvml, tmp_path):
    async def main():
        async with GpuSampler(tmp_path / "g.jsonl", interval_s=0.1) as g:
            g.set_level("a c=2")
            await asyncio.sleep(0.25)
        return g

    g = asyncio.run(main())
    assert g.n_samples >= 3 and g.n_errors == 0
    assert load_gpu_samples(tmp_path / "g.jsonl")["level"].eq("a c=2").sum() >= 4


def test_gpu_facts_and_engine_devices(nvml):
    facts = gpu_facts(engine_devices({"CUDA_VISIBLE_DEVICES": "1"}))
    assert len(facts) == 1
    f = facts[0]
    assert (f["index"], f["name"], f["memory_total_bytes"], f["driver_version"], f["power_limit_w"]) == \
        (1, "NVIDIA H200", MEM_TOTAL, "580.95.05", 700.0)
    assert len(f["uuid_hash"]) == 12 and "GPU-" not in f["uuid_hash"]
    assert len(gpu_facts()) == 2
    assert engine_devices({}) is None and engine_devices({"CUDA_VISIBLE_DEVICES": ""}) == []
    assert engine_devices({"CUDA_VISIBLE_DEVICES": "2,0"}) == [2, 0]
    assert engine_devices({"CUDA_VISIBLE_DEVICES": "0,-1,1"}) == [0]
    # a UUID prefix selects that board
    assert [x["index"] for x in gpu_facts(["GPU-00000001"])] == [1]


FAKE_SMI = """\
#!{python}
import sys, time
args = sys.argv[1:]
if any(a.startswith("--query-gpu=index,name,memory.total") for a in args):
    print("0, NVIDIA H200, 143771, 580.95.05, GPU-abc, 700.00")
    print("1, NVIDIA H200, 143771, 580.95.05, GPU-def, 700.00")
    sys.exit(0)
ms = int(args[args.index("-lms") + 1])
while True:
    print("0, NVIDIA H200, 97, 81920, 143771, 500.00, 1980", flush=True)
    print("1, NVIDIA H200, 0, 0, 143771, [N/A], 345", flush=True)
    time.sleep(ms / 1000)
"""


def test_nvidia_smi_fallback(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    bindir = tmp_path / "bin"
    bindir.mkdir()
    smi = bindir / "nvidia-smi"
    smi.write_text(textwrap.dedent(FAKE_SMI).format(python=sys.executable))
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", str(bindir))
    path = tmp_path / "g.jsonl"
    with GpuSampler(path, interval_s=0.1, devices=[0]) as g:
        assert g.backend == "nvidia-smi"
        g.set_level("in32-out16 c=1")
        time.sleep(0.45)
    df = load_gpu_samples(path)
    assert set(df["index"]) == {0.0} and (df["source"] == "nvidia-smi").all()
    assert (df["mem_used_bytes"] == 81920 * 2**20).all() and (df["power_w"] == 500.0).all()
    assert df["seq"].is_monotonic_increasing and df["seq"].nunique() == len(df)
    row = energy_per_level(df, records({"a": ("in32-out16", 1, 2, 16)})).iloc[0]
    assert row["energy_method"] == "power_integral" and row["output_tokens"] == 32
    assert row["energy_j"] == pytest.approx(500.0 * row["duration_s"], rel=1e-6)
    assert row["j_per_output_token"] == pytest.approx(row["energy_j"] / 32)
    assert row["mem_used_gib_max"] == pytest.approx(80.0)
    facts = gpu_facts([1])
    assert [(f["index"], f["memory_total_bytes"], f["power_limit_w"]) for f in facts] == [(1, 143771 * 2**20, 700.0)]
    assert gpu.parse_smi_line("1, NVIDIA H200, 0, 0, 143771, [N/A], 345")["power_w"] is None


def test_no_gpu_tools(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi here
    path = tmp_path / "g.jsonl"
    with GpuSampler(path, interval_s=0.2) as g:
        g.set_level("a c=1")
        time.sleep(0.05)
    assert g.available is False and "pynvml not installed" in g.reason and "not on PATH" in g.reason
    assert not path.exists()
    assert gpu_facts() == []
    df = load_gpu_samples(path)
    assert df.empty and df.attrs["available"] is False
    assert energy_per_level(df, None).empty


def test_nvml_init_failure_falls_through(monkeypatch, tmp_path):
    nv = fake_pynvml()

    def boom():
        raise nv.NVMLError("Driver Not Loaded")

    nv.nvmlInit = boom
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    monkeypatch.setenv("PATH", str(tmp_path))
    g = GpuSampler(tmp_path / "g.jsonl").start()
    g.stop()
    assert g.available is False and "Driver Not Loaded" in g.reason
    with pytest.raises(ValueError):
        GpuSampler(tmp_path / "g.jsonl", interval_s=1.0)


def test_failing_nvidia_smi_gives_its_message(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f"#!{sys.executable}\nimport sys\n"
                   "sys.stderr.write('NVIDIA-SMI has failed because it could not communicate with the driver\\n')\n"
                   "sys.exit(9)\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    with GpuSampler(tmp_path / "g.jsonl") as g:
        pass
    assert g.available is False and "could not communicate with the driver" in g.reason
    assert not (tmp_path / "g.jsonl").exists()
