"""GPU telemetry during a benchmark: power, energy, memory, utilisation and SM clock per GPU.

:class:`GpuSampler` samples NVML (``pynvml``, nvidia-ml-py) at 2-10 Hz in a background *thread*
(NVML calls block; the asyncio client loop stays free) and appends one JSON line per device per
sample to ``gpu_metrics.jsonl``, tagged with the running load level (``set_level``, as
``MetricsSampler``). Without pynvml, or if ``nvmlInit`` fails, it parses ``nvidia-smi
--query-gpu=... -lms <ms>``; with neither, ``available`` is False with a ``reason``, no file is
written. It never raises into the benchmark. :func:`gpu_facts` describes the GPUs for run.json.

A line: ``t_s`` (perf_counter s since start, read next to the energy counter), ``wall_time``,
``level``, ``seq`` (tick number), ``source``, ``index``, ``name``, ``gpu_util_pct``
(``nvmlDeviceGetUtilizationRates().gpu``: share of the last period with a kernel running, not SM
occupancy), ``mem_used_bytes``, ``mem_total_bytes`` (``nvmlDeviceGetMemoryInfo``), ``power_w``
(``nvmlDeviceGetPowerUsage`` mW / 1000), ``energy_mj`` (``nvmlDeviceGetTotalEnergyConsumption``,
mJ since driver load, Volta+; None where unsupported and from nvidia-smi), ``sm_clock_mhz``.
``devices``: NVML indexes of the *engine's* GPUs (:func:`engine_devices` reads its
``CUDA_VISIBLE_DEVICES``; default all). NVML numbers by PCI bus id, as CUDA does with
``CUDA_DEVICE_ORDER=PCI_BUS_ID``; ``GPU-...`` UUIDs are resolved through NVML.

:func:`energy_per_level`: a level's window, per GPU, runs from its first sample tagged with the
level to the first sample after its last (at most one interval off at each edge). energy_j =
delta of the NVML energy counter over it ("counter"), else the trapezoid of sampled power
("power_integral", blind to spikes shorter than the interval), summed over the engine's GPUs:
whole board, idle and prefill included. power_w_mean = sum over GPUs of mean sampled power;
power_w_max / mem_used_gib_max = highest per-tick sums; gpu_util_pct_mean over GPUs and samples;
output_tokens of the level's successful requests, warmup rounds included (the label and so the
energy cover them); j_per_output_token = energy_j / output_tokens. vLLM 0.26.0's ``vllm bench
serve`` has no energy meter (no NVML in vllm/benchmarks; open PR #56354 proposes this counter
delta per offline run). AIPerf ``--gpu-telemetry`` samples DCGM exporter (POWER_USAGE,
TOTAL_ENERGY_CONSUMPTION) or pynvml per profile run; servelab splits it per load level.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import json
import logging
import math
import os
import select
import shutil
import subprocess
import threading
import time
from collections.abc import Iterable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd

__all__ = ["GPU_FIELDS", "SMI_QUERY", "GpuSampler", "energy_per_level", "engine_devices", "gpu_facts", "level_label",
           "load_gpu_samples", "parse_smi_line"]

log = logging.getLogger(__name__)

GPU_METRICS = "gpu_metrics.jsonl"
GPU_FIELDS = ("t_s", "wall_time", "level", "seq", "source", "index", "name", "gpu_util_pct", "mem_used_bytes",
              "mem_total_bytes", "power_w", "energy_mj", "sm_clock_mhz")
SMI_QUERY = "index,name,utilization.gpu,memory.used,memory.total,power.draw,clocks.sm"
SMI_FACTS = "index,name,memory.total,driver_version,uuid,power.limit"
_MIB, _GIB = 2 ** 20, 2 ** 30


def _now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def _str(v: Any) -> str:  # older nvidia-ml-py returns bytes
    return v.decode() if isinstance(v, bytes) else str(v)


def _hash(uuid: Any) -> str | None:  # tells boards apart without publishing their UUIDs
    return None if uuid is None else hashlib.sha256(_str(uuid).encode()).hexdigest()[:12]


def _try(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception:  # noqa: BLE001 - NVMLError_NotSupported, ImportError, "[N/A]": None
        return None


def engine_devices(env: dict[str, str] | None = None) -> list[int | str] | None:
    """GPU entries (ints, or UUIDs) of ``CUDA_VISIBLE_DEVICES`` in ``env`` (default os.environ);
    None when unset (the engine sees every GPU), [] when empty. CUDA stops at a negative index."""
    cvd = (os.environ if env is None else env).get("CUDA_VISIBLE_DEVICES")
    if cvd is None:
        return None
    out: list[int | str] = []
    for part in filter(None, (p.strip() for p in cvd.split(","))):
        if part.lstrip("-").isdigit() and int(part) < 0:
            break
        out.append(int(part) if part.isdigit() else part)
    return out


def _selected(devices: list[int | str] | None, index: int, uuid: Any) -> bool:
    return devices is None or index in devices or any(isinstance(d, str) and _str(uuid).startswith(d) for d in devices)


def _nvml_handles(nv: Any, devices: list[int | str] | None) -> list[tuple[int, Any]]:
    handles = [(i, nv.nvmlDeviceGetHandleByIndex(i)) for i in range(nv.nvmlDeviceGetCount())]
    return [(i, h) for i, h in handles if _selected(devices, i, devices and _try(nv.nvmlDeviceGetUUID, h))]


def parse_smi_line(line: str) -> dict[str, Any] | None:
    """One row of ``nvidia-smi --query-gpu=SMI_QUERY --format=csv,noheader,nounits`` -> fields."""
    if len(p := [x.strip() for x in line.split(",")]) < 7 or not p[0].isdigit():
        return None
    util, used, total, power, clock = (_try(float, x) for x in p[-5:])  # "[N/A]" -> None
    return {"index": int(p[0]), "name": ",".join(p[1:-5]), "gpu_util_pct": util,
            "mem_used_bytes": None if used is None else int(used * _MIB),
            "mem_total_bytes": None if total is None else int(total * _MIB),
            "power_w": power, "energy_mj": None, "sm_clock_mhz": clock}


class GpuSampler:
    """``with GpuSampler(run_dir / GPU_METRICS, 0.2, engine_devices(env)) as g: g.set_level(...)``;
    ``async with`` too (start/stop in a worker thread). After start, ``available`` is True with
    ``backend`` "nvml" | "nvidia-smi", or False with ``reason``. Errors counted, never raised."""

    def __init__(self, path: str | os.PathLike[str], interval_s: float = 0.2,
                 devices: Iterable[int | str] | None = None, *, smi: str = "nvidia-smi") -> None:
        if not 0.1 <= interval_s <= 0.5:
            raise ValueError("interval_s must be within 0.1..0.5 s (2-10 Hz)")
        self.path, self.interval_s, self.smi = Path(path), float(interval_s), smi
        self.devices = None if devices is None else list(devices)
        self.available, self.backend = None, None  # type: bool | None, str | None
        self.reason = self.last_error = self.level = None  # type: str | None
        self.n_samples = self.n_errors = self._seq = 0
        self._t0, self._fh, self._nv = 0.0, None, None  # type: ignore[var-annotated]
        self._lock, self._stop = threading.Lock(), threading.Event()
        self._thread: threading.Thread | None = None
        self._handles: list[tuple[int, Any]] = []
        self._proc: subprocess.Popen[str] | None = None
        self._no_energy: set[int] = set()
        self._smi_seen: set[int] = set()

    def set_level(self, label: str | None) -> None:
        """Label attached to every following sample (``Level.label``, e.g. "in256-out64 c=4")."""
        self.level = label

    def start(self) -> GpuSampler:
        if self.available is not None:
            raise RuntimeError("GpuSampler already started")
        self._t0, why = time.perf_counter(), []
        for name, begin, undo in (("NVML", self._start_nvml, self._close_nvml),
                                  (self.smi, self._start_smi, self._end_smi)):
            try:
                missing = begin()
            except Exception as e:  # noqa: BLE001 - nvmlInit failed, nvidia-smi unusable: next source
                missing = repr(e)
                undo()
            if missing is None:
                self._thread.start()  # type: ignore[union-attr]
                return self
            why.append(f"{name}: {missing}")
        self.available, self.reason = False, "; ".join(why)
        log.info("GPU telemetry unavailable: %s", self.reason)
        return self

    def stop(self) -> None:
        """Stop sampling (and nvidia-smi), take a final NVML sample, close the file."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._proc is not None:
            self._proc.kill()  # its stdout ends: the reader thread returns
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        self._end_smi()
        if self.backend == "nvml":
            self._sample_nvml()
        self._close_nvml()
        with self._lock:
            self._fh = self._fh.close() if self._fh else None  # close() returns None

    __enter__ = start

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> GpuSampler:
        return await asyncio.to_thread(self.start)

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.stop)

    def _start_nvml(self) -> str | None:
        nv = _try(importlib.import_module, "pynvml")  # optional; None if missing
        if nv is None:
            return "pynvml not installed"
        nv.nvmlInit()
        self._nv, self._handles = nv, _nvml_handles(nv, self.devices)
        if not self._handles:
            self._close_nvml()
            return f"none of the engine's GPUs {self.devices} found"
        self._open("nvml")
        self._sample_nvml()
        self._thread = threading.Thread(target=self._nvml_loop, name="GpuSampler", daemon=True)
        return None

    def _close_nvml(self) -> None:
        if self._nv is not None:
            _try(self._nv.nvmlShutdown)
        self._nv = None

    def _nvml_loop(self) -> None:
        while True:
            n = math.floor((time.perf_counter() - self._t0) / self.interval_s) + 1
            if self._stop.wait(max(0.0, self._t0 + n * self.interval_s - time.perf_counter())):
                return
            self._sample_nvml()

    def _sample_nvml(self) -> None:
        nv, level, wall = self._nv, self.level, _now_iso()
        try:
            for idx, h in self._handles:
                t = round(time.perf_counter() - self._t0, 6)  # read next to the counter: energy / t_s is exact
                energy = None if idx in self._no_energy else _try(nv.nvmlDeviceGetTotalEnergyConsumption, h)
                util, mem = _try(nv.nvmlDeviceGetUtilizationRates, h), _try(nv.nvmlDeviceGetMemoryInfo, h)
                power = _try(nv.nvmlDeviceGetPowerUsage, h)
                if energy is None:
                    self._no_energy.add(idx)  # pre-Volta or not supported: ask once
                self._write({"t_s": t, "wall_time": wall, "level": level, "seq": self._seq, "source": "nvml",
                             "index": idx, "name": _str(_try(nv.nvmlDeviceGetName, h) or ""),
                             "gpu_util_pct": None if util is None else float(util.gpu),
                             "mem_used_bytes": None if mem is None else int(mem.used),
                             "mem_total_bytes": None if mem is None else int(mem.total),
                             "power_w": None if power is None else power / 1000.0,
                             "energy_mj": None if energy is None else int(energy),
                             "sm_clock_mhz": _try(nv.nvmlDeviceGetClockInfo, h, getattr(nv, "NVML_CLOCK_SM", 1))})
            self._seq += 1
            self.n_samples += 1
        except Exception as e:  # noqa: BLE001 - e.g. disk full: count it, keep the benchmark going
            self.n_errors, self.last_error = self.n_errors + 1, repr(e)

    def _start_smi(self) -> str | None:
        if (exe := shutil.which(self.smi)) is None:
            return "not on PATH"
        self._proc = subprocess.Popen(
            [exe, f"--query-gpu={SMI_QUERY}", "--format=csv,noheader,nounits", "-lms",
             str(round(self.interval_s * 1000))], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if not select.select([self._proc.stdout], [], [], 10.0)[0]:  # a wedged driver must not hang the run
            raise RuntimeError("no row within 10 s")
        first = self._proc.stdout.readline()  # type: ignore[union-attr]  # the first row, or EOF on exit
        if (row := parse_smi_line(first)) is None:  # e.g. "NVIDIA-SMI has failed because ..." (stderr joined)
            raise RuntimeError(f"no readable row: {first.strip()[:200]!r}")
        self._open("nvidia-smi")
        self._smi_row(row)
        self._thread = threading.Thread(target=self._smi_loop, name="GpuSampler-smi", daemon=True)
        return None

    def _smi_loop(self) -> None:
        for line in self._proc.stdout:  # type: ignore[union-attr]  # EOF once stop() ends nvidia-smi
            row = parse_smi_line(line)
            if row is not None and not self._stop.is_set():
                self._smi_row(row)
            elif row is None and line.strip():
                self.n_errors, self.last_error = self.n_errors + 1, line.strip()[:200]

    def _smi_row(self, row: dict[str, Any]) -> None:
        if row["index"] in self._smi_seen:  # an index repeats: the next tick began
            self._seq, self.n_samples = self._seq + 1, self.n_samples + 1
            self._smi_seen.clear()
        self._smi_seen.add(row["index"])
        if self.devices is None or row["index"] in self.devices:
            self._write({"t_s": round(time.perf_counter() - self._t0, 6), "wall_time": _now_iso(),
                         "level": self.level, "seq": self._seq, "source": "nvidia-smi", **row})

    def _end_smi(self) -> None:
        p, self._proc = self._proc, None
        if p is not None:
            p.kill()  # nvidia-smi -lms keeps no state worth a graceful exit
            p.communicate()  # reap it, close the pipe

    def _open(self, backend: str) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(self.path, "a", encoding="utf-8")
        self.backend, self.available = backend, True

    def _write(self, rec: dict[str, Any]) -> None:
        try:
            with self._lock:
                if self._fh is not None:
                    self._fh.write(json.dumps(rec, allow_nan=False) + "\n")
                    self._fh.flush()
        except Exception as e:  # noqa: BLE001
            self.n_errors, self.last_error = self.n_errors + 1, repr(e)


def gpu_facts(devices: Iterable[int | str] | None = None, *, smi: str = "nvidia-smi") -> list[dict[str, Any]]:
    """The engine's GPUs for run.json: index, name, memory_total_bytes, driver_version, uuid_hash
    (12 hex of sha256(UUID)), power_limit_w, source; [] when neither NVML nor nvidia-smi answers."""
    devices = None if devices is None else list(devices)
    nv = _try(importlib.import_module, "pynvml")  # optional; None if missing
    if nv is not None and (_try(nv.nvmlInit), _try(nv.nvmlDeviceGetCount))[1] is not None:  # else nvidia-smi
        try:
            driver, out = _str(_try(nv.nvmlSystemGetDriverVersion) or ""), []
            for idx, h in _nvml_handles(nv, devices):
                mem, limit = _try(nv.nvmlDeviceGetMemoryInfo, h), _try(nv.nvmlDeviceGetPowerManagementLimit, h)
                out.append({"index": idx, "name": _str(_try(nv.nvmlDeviceGetName, h) or ""),
                            "memory_total_bytes": None if mem is None else int(mem.total), "driver_version": driver,
                            "uuid_hash": _hash(_try(nv.nvmlDeviceGetUUID, h)),
                            "power_limit_w": None if limit is None else limit / 1000.0, "source": "nvml"})
            return out
        finally:
            _try(nv.nvmlShutdown)
    exe = shutil.which(smi)
    try:
        text = subprocess.run([exe, f"--query-gpu={SMI_FACTS}", "--format=csv,noheader,nounits"], capture_output=True,
                              text=True, timeout=10, check=False).stdout if exe else ""
    except (OSError, subprocess.SubprocessError):
        text = ""
    out = []
    for p in ([x.strip() for x in line.split(",")] for line in text.splitlines()):
        if len(p) >= 6 and p[0].isdigit() and _selected(devices, int(p[0]), p[-2]):
            mem = _try(float, p[-4])
            out.append({"index": int(p[0]), "name": ",".join(p[1:-4]),
                        "memory_total_bytes": None if mem is None else int(mem * _MIB), "driver_version": p[-3],
                        "uuid_hash": _hash(p[-2]), "power_limit_w": _try(float, p[-1]), "source": "nvidia-smi"})
    return out


def load_gpu_samples(path: str | os.PathLike[str]) -> pd.DataFrame:
    """A ``gpu_metrics.jsonl`` as a DataFrame, one row per device per sample (unreadable lines are
    skipped). A missing or empty file gives an empty frame with ``attrs["available"] = False``."""
    rows = []
    for line in Path(path).read_text(encoding="utf-8").splitlines() if Path(path).exists() else []:
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut short by a crash
            continue
    df = pd.DataFrame(rows)
    df = df.reindex(columns=[*GPU_FIELDS, *(c for c in df.columns if c not in GPU_FIELDS)])
    num = [c for c in GPU_FIELDS if c not in ("wall_time", "level", "source", "name")]
    df[num] = df[num].apply(pd.to_numeric, errors="coerce").astype("float64")
    df["wall_time"] = pd.to_datetime(df["wall_time"], utc=True, format="ISO8601")
    df.attrs["available"] = bool(rows)
    return df


def level_label(bucket: str, concurrency: int, rate_rps: float = 0.0) -> str:
    """``runner.Level.label`` from a record's bucket, concurrency and rate."""
    return f"{bucket} rate={rate_rps:g}/s" if rate_rps else f"{bucket} c={int(concurrency)}"


ENERGY_COLUMNS = ["level", "duration_s", "samples", "gpus", "power_w_mean", "power_w_max", "energy_j", "energy_method",
                  "requests_ok", "output_tokens", "j_per_output_token", "mem_used_gib_max", "gpu_util_pct_mean"]


def _window_energy(w: pd.DataFrame) -> tuple[float, bool]:
    """Joules over one GPU's window: counter delta (True) or trapezoid of power (False)."""
    e0, e1 = w["energy_mj"].iloc[0], w["energy_mj"].iloc[-1]
    if pd.notna(e0) and pd.notna(e1) and e1 >= e0:
        return (e1 - e0) / 1000.0, True
    pw = w.dropna(subset=["power_w"])
    t, p = pw["t_s"].to_numpy(), pw["power_w"].to_numpy()
    return (float(((p[1:] + p[:-1]) / 2 * (t[1:] - t[:-1])).sum()) if len(p) > 1 else 0.0), False


def energy_per_level(samples_df: pd.DataFrame, records_df: pd.DataFrame | None) -> pd.DataFrame:
    """Per level label: duration, power summed over GPUs, energy, J per output token, peak memory,
    mean GPU utilisation (definitions in the module docstring). Records need bucket, concurrency,
    ok, output_tokens (rate_rps optional)."""
    s = samples_df[samples_df["level"].notna()]
    if s.empty:
        return pd.DataFrame(columns=ENERGY_COLUMNS)
    tokens: dict[str, tuple[int, float]] = {}
    if records_df is not None and len(records_df):
        r, rate = records_df, records_df.get("rate_rps", pd.Series(0.0, index=records_df.index))
        r = r.assign(_label=[level_label(b, c, float(x or 0)) for b, c, x in zip(r["bucket"], r["concurrency"], rate)])
        for lab, g in r[r["ok"].astype(bool)].groupby("_label"):
            tokens[str(lab)] = (len(g), float(pd.to_numeric(g["output_tokens"], errors="coerce").fillna(0).sum()))
    per_gpu = [g.reset_index(drop=True) for _, g in samples_df.sort_values(["index", "t_s"]).groupby("index")]
    rows = []
    for lab in dict.fromkeys(s.sort_values("t_s")["level"]):
        energy, counter, durations = 0.0, True, []
        for g in per_gpu:
            pos = g.index[g["level"] == lab]
            if len(pos):
                w = g.iloc[pos[0]:min(pos[-1] + 1, len(g) - 1) + 1]
                durations.append(float(w["t_s"].iloc[-1] - w["t_s"].iloc[0]))
                e, by_counter = _window_energy(w)
                energy, counter = energy + e, counter and by_counter
        lv = s[s["level"] == lab]
        tick = lv.groupby("seq").agg(power=("power_w", "sum"), mem=("mem_used_bytes", "sum"))
        n_ok, out_tok = tokens.get(str(lab), (0, 0.0))
        rows.append({"level": lab, "duration_s": max(durations), "samples": lv["seq"].nunique(),
                     "gpus": lv["index"].nunique(), "power_w_mean": float(lv.groupby("index")["power_w"].mean().sum()),
                     "power_w_max": float(tick["power"].max()), "energy_j": energy,
                     "energy_method": "counter" if counter else "power_integral", "requests_ok": n_ok,
                     "output_tokens": out_tok, "j_per_output_token": energy / out_tok if out_tok else float("nan"),
                     "mem_used_gib_max": float(tick["mem"].max() / _GIB),
                     "gpu_util_pct_mean": float(lv["gpu_util_pct"].mean())})
    return pd.DataFrame(rows, columns=ENERGY_COLUMNS)
