"""The machine's GPUs now, for placing engines on them (`servelab.placement`): index, name, total and free
memory, and the compute processes on each, read through NVML (`pynvml`, nvidia-ml-py), else `nvidia-smi`.
Only the GPUs the user's own `CUDA_VISIBLE_DEVICES` leaves visible count (by NVML index or UUID; NVML
numbers by PCI bus id, so an engine gets `CUDA_DEVICE_ORDER=PCI_BUS_ID` with its indices).

`SERVELAB_GPUS` stands in for the machine (tests, and planning a study for a machine one does not have):
"8xH100" or "2xNVIDIA H200" (the hardware table's memory), or JSON, a list of
{"name", "memory_gib", "free_gib"}. `wait_released` waits after a stop until the stopped server's
processes have left their GPUs (a killed server's memory is freed after its process is gone, and the next
server must not start on memory still held).
"""

from __future__ import annotations

import importlib
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..errors import UserError
from ..tables import hardware
from .gpu import engine_devices

FAKE_ENV = "SERVELAB_GPUS"
_MIB, _GIB = 2**20, 2**30


@dataclass(frozen=True)
class Gpu:
    """One GPU as the placement sees it. `free_bytes` None: not known (a stand-in without it is all free)."""

    index: int
    name: str
    total_bytes: int | None
    free_bytes: int | None
    processes: tuple[int, ...] = field(default=())  # pids of the compute processes on it now
    source: str = "nvml"

    def label(self) -> str:
        mem = f", {self.free_bytes / _GIB:.1f} of {self.total_bytes / _GIB:.1f} GiB free" \
            if self.total_bytes and self.free_bytes is not None else ""
        return f"GPU {self.index} ({self.name}{mem})"


class InventoryError(UserError, ValueError):
    """SERVELAB_GPUS (or `--gpus`) cannot be read: one line, exit 2."""


def _try(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception:  # noqa: BLE001 - NVMLError_NotSupported and the like: not known
        return None


def _str(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def stand_in(spec: str) -> list[Gpu]:
    """The GPUs `SERVELAB_GPUS` describes (see the module docstring); InventoryError naming what is wrong."""
    spec = spec.strip()
    if spec.startswith("["):
        try:
            rows = json.loads(spec)
            return [Gpu(i, str(r["name"]), int(float(r["memory_gib"]) * _GIB),
                        int(float(r.get("free_gib", r["memory_gib"])) * _GIB), source="stand-in")
                    for i, r in enumerate(rows)]
        except (ValueError, KeyError, TypeError) as e:
            raise InventoryError(f"{FAKE_ENV}: expected a JSON list of {{name, memory_gib, free_gib}}: {e}") from None
    m = re.fullmatch(r"(\d+)\s*[xX]\s*(.+)", spec)
    if not m:
        raise InventoryError(f"{FAKE_ENV}={spec!r}: expected COUNTxNAME (e.g. 8xH100) or a JSON list")
    row = hardware_row(m.group(2))
    total = int(row["memory_GB"] * 1e9)
    return [Gpu(i, row["name"], total, total, source="stand-in") for i in range(int(m.group(1)))]


def hardware_row(name: str) -> dict[str, Any]:
    """The hardware table's row for a GPU name or alias (case-insensitive); InventoryError otherwise."""
    def norm(s: str) -> str:  # as analysis.roofline.get_hardware: case, - and _ and spacing ignored
        return " ".join(s.lower().replace("_", " ").replace("-", " ").split())

    for row in hardware():
        if norm(name) in {norm(row["name"]), *(norm(a) for a in row.get("aliases", []))}:
            return row
    known = ", ".join(r["name"] for r in hardware())
    raise InventoryError(f"unknown GPU {name!r}: the hardware table (lib/servelab/data/hardware.yaml) has {known}")


def _visible(gpus: list[Gpu], uuids: dict[int, str]) -> list[Gpu]:
    devices = engine_devices()
    if devices is None:
        return gpus
    return [g for g in gpus if g.index in devices
            or any(isinstance(d, str) and uuids.get(g.index, "").startswith(d) for d in devices)]


def _nvml() -> list[Gpu] | None:
    nv = _try(importlib.import_module, "pynvml")
    if nv is None:
        return None
    try:
        nv.nvmlInit()
    except Exception:  # noqa: BLE001 - no driver: no NVIDIA GPU that NVML sees
        return None
    try:
        out, uuids = [], {}
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            mem = _try(nv.nvmlDeviceGetMemoryInfo, h)
            procs = _try(nv.nvmlDeviceGetComputeRunningProcesses, h) or []
            uuids[i] = _str(_try(nv.nvmlDeviceGetUUID, h) or "")
            out.append(Gpu(i, _str(_try(nv.nvmlDeviceGetName, h) or ""), None if mem is None else int(mem.total),
                           None if mem is None else int(mem.free), tuple(int(p.pid) for p in procs), "nvml"))
        return _visible(out, uuids)
    finally:
        _try(nv.nvmlShutdown)


def _smi(smi: str = "nvidia-smi") -> list[Gpu]:
    exe = shutil.which(smi)
    if exe is None:
        return []
    try:
        text = subprocess.run([exe, "--query-gpu=index,name,memory.total,memory.free,uuid",
                               "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=15,
                              check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    out, uuids = [], {}
    for p in ([x.strip() for x in line.split(",")] for line in text.splitlines()):
        if len(p) >= 5 and p[0].isdigit():
            total, free = _try(float, p[-3]), _try(float, p[-2])
            uuids[int(p[0])] = p[-1]
            out.append(Gpu(int(p[0]), ",".join(p[1:-3]), None if total is None else int(total * _MIB),
                           None if free is None else int(free * _MIB), source="nvidia-smi"))
    return _visible(out, uuids)


def inventory() -> list[Gpu]:
    """The GPUs this machine lets servelab use now ([] on a machine without NVIDIA GPUs)."""
    spec = os.environ.get(FAKE_ENV)
    if spec:
        return stand_in(spec)
    found = _nvml()
    return found if found is not None else _smi()


def source_line(gpus: list[Gpu]) -> str:
    """How the GPUs were read, for the dry run and design.json."""
    if not gpus:
        return "no NVIDIA GPU (NVML and nvidia-smi found none)"
    src = {g.source for g in gpus}
    if src == {"planned"}:
        return f"{len(gpus)} GPU{'s' if len(gpus) > 1 else ''} as the study plans them (this machine has none; memory unknown)"
    how = {"nvml": "NVML", "nvidia-smi": "nvidia-smi", "stand-in": f"{FAKE_ENV}, not this machine",
           "instance": "the instance type's, from the price table"}
    names = sorted({g.name for g in gpus})
    return f"{len(gpus)} x {' / '.join(names)} ({', '.join(how[s] for s in sorted(src))})"


def wait_released(indices: Iterable[int], pids: Iterable[int], timeout_s: float = 60.0) -> float:
    """Wait until none of `pids` runs on the GPUs `indices` any more (NVML's compute processes); returns the
    seconds waited (0 without NVML or a stand-in: nothing to read)."""
    if os.environ.get(FAKE_ENV):
        return 0.0
    pids, want = set(pids), set(indices)
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        gpus = _nvml()
        if gpus is None or not any(set(g.processes) & pids for g in gpus if g.index in want):
            break
        time.sleep(0.5)
    return time.monotonic() - t0


__all__ = ["FAKE_ENV", "Gpu", "InventoryError", "hardware_row", "inventory", "source_line", "stand_in",
           "wait_released"]
