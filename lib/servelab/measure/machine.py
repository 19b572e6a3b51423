"""What else used the machine while a round was measured: the idle engines of an interleaved run
(their process trees), every other process (the machine's busy CPU time from /proc/stat minus the
client's and the engines' own), and the hypervisor (steal time). A round during which other
processes took a quarter of a core or more is disturbed whatever its numbers say; `wait_quiet`
holds a re-measurement back until they stop. Linux only; elsewhere the machine-wide figures are
absent and only the statistical rule (`measure.outliers`) flags a round. Not for deciding what to
re-measure (`measure.interleave`)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

FOREIGN_CPU = 0.25  # cores: other processes (or steal) at least this busy over a round disturb it
PROC_STAT = Path("/proc/stat")
SLACK_TICKS = 3  # the clock ticks a difference of CPU times may be off by (each reading rounds down)


def _ticks() -> float:
    return float(os.sysconf("SC_CLK_TCK")) if hasattr(os, "sysconf") else 100.0


def machine_cpu() -> tuple[float, float] | None:
    """(busy, steal) CPU seconds of the whole machine since boot (/proc/stat's first line: user,
    nice, system, irq and softirq are busy; guest time is inside user); None where unreadable."""
    try:
        f = PROC_STAT.read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    v = [float(x) for x in f[1:]] + [0.0] * 10
    hz = _ticks()
    return (v[0] + v[1] + v[2] + v[5] + v[6]) / hz, v[7] / hz


def _tree(pid: int) -> list[psutil.Process]:
    with contextlib.suppress(psutil.Error):
        p = psutil.Process(pid)
        return [p, *p.children(recursive=True)]
    return []


def _cpu(procs: list[psutil.Process]) -> float:
    total = 0.0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            t = p.cpu_times()
            total += t.user + t.system
    return total


class MachineMeter:
    """Around each round: the other engines' CPU (`neighbour_cpu_frac_*`, fractions of a core), and
    the cores every process outside the client and the engines used (`foreign_cpu`) and the
    hypervisor stole (`steal_cpu`), with the round's wall-clock window (`t0_unix`, `t1_unix`)."""

    def __init__(self, pids: Mapping[str, int], *, servers_known: bool = True) -> None:
        """`pids`: each engine's process; `servers_known` False when a server measured here has no
        known process (an attached server, a test's stand-in): its CPU would read as another
        process's, so `foreign_cpu` is not measured (steal still is)."""
        self.procs = {sid: _tree(pid) for sid, pid in pids.items()}
        self.procs = {k: v for k, v in self.procs.items() if v}
        self.servers_known = servers_known

    def own(self) -> float:
        """CPU seconds of the client (this process and its workers) and every engine's tree."""
        return _cpu(_tree(os.getpid())) + sum(_cpu(p) for p in self.procs.values())

    def around(self, measured: str) -> "MachineMeter.Round":
        return MachineMeter.Round(self, [s for s in self.procs if s != measured])

    def window(self) -> "MachineMeter.Round":
        """A window with no engine measured (`wait_quiet`)."""
        return MachineMeter.Round(self, [])

    @dataclass
    class Round:
        meter: "MachineMeter"
        others: list[str]
        t0: float = 0.0
        t0_unix: float = 0.0
        cpu0: dict[str, float] = field(default_factory=dict)
        machine0: tuple[float, float] | None = None
        own0: float = 0.0

        def start(self) -> None:
            self.cpu0 = {s: _cpu(self.meter.procs[s]) for s in self.others}
            self.machine0, self.own0 = machine_cpu(), self.meter.own()
            self.t0, self.t0_unix = time.perf_counter(), time.time()

        def stop(self) -> dict[str, Any]:
            wall = time.perf_counter() - self.t0
            if wall <= 0:
                return {}
            out: dict[str, Any] = {"t0_unix": round(self.t0_unix, 3), "t1_unix": round(self.t0_unix + wall, 3)}
            m1 = machine_cpu()
            if self.machine0 is not None and m1 is not None:
                if self.meter.servers_known:
                    used = m1[0] - self.machine0[0]
                    # CPU times count in clock ticks (10 ms): a short round's figure is a lower bound
                    out["foreign_cpu"] = round(max(0.0, used - (self.meter.own() - self.own0) - SLACK_TICKS / _ticks())
                                               / wall, 3)
                out["steal_cpu"] = round(max(0.0, m1[1] - self.machine0[1] - SLACK_TICKS / _ticks()) / wall, 3)
            if self.others:
                fr = [(_cpu(self.meter.procs[s]) - self.cpu0[s]) / wall for s in self.others]
                out.update(neighbours=len(fr), neighbour_cpu_frac_max=max(fr), neighbour_cpu_frac_sum=sum(fr))
            return out


def busy(stats: Mapping[str, Any]) -> float:
    """Cores taken from the measurement by other processes and the hypervisor (0 when not measured)."""
    return float(stats.get("foreign_cpu") or 0.0) + float(stats.get("steal_cpu") or 0.0)


async def wait_quiet(meter: MachineMeter, *, most_s: float, step_s: float = 1.0) -> tuple[float, float]:
    """Wait, one `step_s` window at a time, until other processes and steal use less than
    `FOREIGN_CPU` cores or `most_s` has passed. Returns (seconds waited, cores busy in the last window)."""
    t0, last = time.monotonic(), 0.0
    while True:
        w = meter.window()
        w.start()
        await asyncio.sleep(step_s)
        last = busy(w.stop())
        if last < FOREIGN_CPU or time.monotonic() - t0 + step_s > most_s:
            return time.monotonic() - t0, last


class LaunchWatch:
    """Other processes' CPU and steal while the engines start (`with LaunchWatch() as w: ...`), sampled
    every `every_s` in a thread: a start that shared the cores with another process took longer, and
    the engine it left running may not serve like one started on a quiet machine.

    Starting engines spawn short-lived processes of their own (the compiled engine's C++ compilers, a
    notebook's kernel), so "other" is not "the machine minus this process tree" (a child that ended
    between two samples would count as another's): every process outside this process's tree is read
    by itself, each keeping its last reading when it ends; one that lives less than a sample is missed."""

    def __init__(self, every_s: float = 1.0) -> None:
        self.every_s = every_s
        self.samples: list[tuple[float, float]] = []  # (end of the interval, unix; cores busy over it)
        self.t0 = time.time()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="launch-watch", daemon=True)
        self._mine: set[tuple[int, float]] = set()
        self.seen: dict[tuple[int, float], float] = {}  # another process (pid, created) -> CPU seconds, last read
        self._base: dict[tuple[int, float], float] = {}  # ... at its first (0 for one born while watched)

    def __enter__(self) -> "LaunchWatch":
        self.t0 = time.time()
        self._last = (time.monotonic(), self._others(), self._steal())
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _steal(self) -> float:
        m = machine_cpu()
        return m[1] if m else 0.0

    def _others(self) -> float:
        """CPU seconds that the processes outside this tree used since they were first seen."""
        mine = {p.pid for p in _tree(os.getpid())}
        for p in psutil.process_iter():
            with contextlib.suppress(psutil.Error):
                key = (p.pid, p.create_time())
                if key in self._mine or p.pid in mine:
                    self._mine.add(key)  # once this tree's, always (an orphaned child stays ours)
                    continue
                t = p.cpu_times()
                self.seen[key] = t.user + t.system
                self._base.setdefault(key, self.seen[key] if key[1] < self.t0 else 0.0)
        return sum(v - self._base[k] for k, v in self.seen.items())

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            t, others, steal = time.monotonic(), self._others(), self._steal()
            t_, others_, steal_ = self._last
            if t > t_:
                self.samples.append((time.time(), max(0.0, others - others_ + steal - steal_) / (t - t_)))
            self._last = (t, others, steal)

    def windows(self, spans: Mapping[str, tuple[float, float]] | None = None, *, least_s: float = 2.0
                ) -> list[dict[str, Any]]:
        """The stretches of `least_s` or more in which other processes and steal took `FOREIGN_CPU`
        cores or more: `from`, `to` (unix), `busy_cpu` (the most in a sample), `cpu_s` (CPU seconds
        taken) and `starts`, the configurations whose start (`spans`: config -> unix from, to) overlaps."""
        out: list[dict[str, Any]] = []
        prev = self.t0
        for t, cores in self.samples:
            if cores >= FOREIGN_CPU:
                if out and out[-1]["to"] >= prev - 1e-6:
                    w = out[-1]
                    w["to"], w["busy_cpu"], w["cpu_s"] = t, max(w["busy_cpu"], cores), w["cpu_s"] + cores * (t - prev)
                else:
                    out.append({"from": prev, "to": t, "busy_cpu": cores, "cpu_s": cores * (t - prev)})
            prev = t
        out = [w for w in out if w["to"] - w["from"] >= least_s - 1e-6]
        for w in out:
            w.update({k: round(w[k], 3) for k in ("from", "to", "busy_cpu", "cpu_s")})
            w["starts"] = [c for c, (a, b) in (spans or {}).items() if a < w["to"] and b > w["from"]]
        return out


__all__ = ["FOREIGN_CPU", "LaunchWatch", "MachineMeter", "busy", "machine_cpu", "wait_quiet"]
