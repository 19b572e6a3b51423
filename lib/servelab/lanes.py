"""A study's configurations on the machine's GPUs, as `placement` placed them: the phases one after another,
the lanes of a phase side by side (one thread each, on their own GPUs), in each lane its groups one after
another. A group's servers start together (`placement.stagger_s` apart) on its GPUs, each with its own port
and `CUDA_VISIBLE_DEVICES`, from its engine's own Python (`engine.python`); each configuration is then measured
on its server through the ordinary stages (`execute.run_config`: provision, launch — which hands on the
running server —, benchmark, diagnose), one at a time, and a server stops after its last configuration; the
next server on those GPUs starts once NVML shows the stopped one's processes gone.

Around each configuration's workload: the server's own answers before and after (`/version` or
`/get_server_info`, `/v1/models`, `/tokenize`, `/metrics`: `recorded/`), its real-weights checks instead of
the workload (`checks:`, `measure.realchecks`), the peer tools on the same server (`peers:`: `vllm bench serve`,
SGLang's bench_serving, each from its engine's Python, under `peer/<config>/`) and a capacity search after it
(`capacity_runs:`, run folder `<config>-capacity`). A configuration whose run.json says complete is skipped on
`--resume`; past `--stop-after` no server starts (one that started measures its configurations: its start is
paid for), and what is left stays for `--resume`.
A stop signal stops every server this run started. Not for deciding where (`placement`) nor for the CPU's
side-by-side design (`sidebyside`).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from .analysis.peers import peer_command
from .execute import RunIncomplete, StageFailed, Stopped, close_partial, log, run_config, stop_children
from .hosts import EngineError, LocalHost
from .hosts.local import model_dir_for, served_path
from .hosts.process import Engine, engine_python
from .measure.inventory import wait_released
from .measure.realchecks import run_checks
from .placement import Group, Lane, Placement, Server
from .plan import ConfigPlan, plan_config
from .runfolder import QUALITY_JSON, SPECULATIVE_JSONL, RunFolder, write_json
from .schema import EngineParams, Study
from .sidebyside import write_effective

RECORDED = "recorded"  # the server's own answers, beside a configuration's run files
PEER_ENGINE = {"vllm-bench": "vllm", "sglang-bench": "sglang"}
PROMPT = "This is deterministic benchmark input text."


def placed_study(study: Study, placement: Placement) -> Study:
    """The study with every configuration's engine on its server's port and GPUs (what its stages resolve)."""
    over = {c: s.engine for s in placement.servers() for c in s.configs}
    confs = [c.model_copy(update={"engine": {**c.engine, "port": over[c.id].port,
                                             "env": {**c.engine.get("env", {}), **_gpu_env(over[c.id])}}})
             if c.id in over else c for c in study.configurations]
    return study.model_copy(update={"configurations": confs})


def _gpu_env(eng: EngineParams) -> dict[str, str]:
    return {k: eng.env[k] for k in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER") if k in eng.env}


def http(url: str, body: dict[str, Any] | None = None, timeout: float = 20.0) -> tuple[int, str]:
    """(HTTP status, body) of a GET (or a POST of `body`); (0, the error) when the server does not answer."""
    try:
        r = httpx.post(url, json=body, timeout=timeout) if body is not None else httpx.get(url, timeout=timeout)
        return r.status_code, r.text
    except httpx.HTTPError as e:
        return 0, f"{type(e).__name__}: {e}"


def server_answers(base: str, model: str) -> dict[str, tuple[int, str]]:
    """The server's own answers before a configuration's workload: file name -> (HTTP status, body)."""
    return {"get_server_info.json": http(base + "/get_server_info"), "version.json": http(base + "/version"),
            "models.json": http(base + "/v1/models"),
            "tokenize-prompt.json": http(base + "/tokenize", {"model": model, "prompt": PROMPT}),
            "tokenize-chat.json": http(base + "/tokenize", {"model": model,
                                                            "messages": [{"role": "user", "content": PROMPT}]}),
            "metrics-before.txt": http(base + "/metrics")}


def save_answers(rdir: Path, answers: dict[str, tuple[int, str]]) -> None:
    """Each answer that came (HTTP 200) as a file under `recorded/`, every status in its status.json."""
    d = rdir / RECORDED
    d.mkdir(parents=True, exist_ok=True)
    sp = d / "status.json"
    status = json.loads(sp.read_text()) if sp.exists() else {}
    for name, (code, body) in answers.items():
        status[name] = code
        if code == 200:
            (d / name).write_text(body)
    sp.write_text(json.dumps(status, indent=1) + "\n")


CHECK_FILE = {"quality": QUALITY_JSON, "speculative": SPECULATIVE_JSONL}  # what each real-weights check writes


def done(study: Study, root: Path, cid: str) -> bool:
    """Whether a configuration is measured: its run complete, or its checks' files written."""
    if cid in study.checks:
        return all((root / cid / CHECK_FILE[c]).exists() for c in study.checks[cid])
    return RunFolder(root / cid).run.get("status") == "complete"


@dataclass
class Runner:
    """One study run on GPUs (see the module docstring); `run` returns the configurations that failed, `left`
    lists those not started before the deadline."""

    study: Study  # as placed (`placed_study`)
    placement: Placement
    root: Path
    notebooks: bool = True
    resume: bool = False
    deadline: float | None = None  # time.monotonic(): no server starts after it (a started one measures its own)
    say: Callable[[str], None] = log
    engines: dict[str, Engine] = field(default_factory=dict)
    startup_s: dict[str, float] = field(default_factory=dict)
    failed: list[str] = field(default_factory=list)
    left: list[str] = field(default_factory=list)
    measuring: set[str] = field(default_factory=set)  # the configurations being measured now
    stop_reason: str = ""  # the stop signal's (or Ctrl-C's), once one came
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.host = LocalHost(self.study)
        self.plans: dict[str, ConfigPlan] = {c: plan_config(self.study, c, self.host)
                                             for s in self.placement.servers() for c in s.configs}

    # -- the whole run ------------------------------------------------------------------------
    def run(self) -> list[str]:
        threads: list[threading.Thread] = []
        try:
            for phase in self.placement.phases:
                threads = [threading.Thread(target=self._lane_safely, args=(lane,), name=f"lane-{lane.gpus}",
                                            daemon=True)  # a stop signal must not wait for a lane's measurement
                           for lane in phase]
                for t in threads:
                    t.start()
                for t in threads:
                    while t.is_alive():
                        t.join(0.5)  # the main thread stays free for a stop signal
        except KeyboardInterrupt as e:
            self._stop.set()
            reason = self.stop_reason = e.name if isinstance(e, Stopped) else "the user (Ctrl-C)"
            self.stop_all()  # the servers first: a lane's measurement ends at once and writes what it measured
            for t in threads:
                t.join(10)
            stop_children()
            for cid in self.plans:  # the stop is the reason, also where a lane saw its server go with it
                close_partial(self.root / cid, reason, over_partial=cid in self.measuring)
            raise
        finally:
            self._stop.set()
            self.stop_all()
        if self.left:
            self.say(f"not started before --stop-after: {', '.join(self.left)} (continue with --resume)")
        return self.failed

    def stop_all(self) -> None:
        with self._lock:
            engines = list(self.engines.items())
            self.engines.clear()
        for sid, eng in engines:
            eng.stop()
            self.say(f"server {sid}: stopped")

    def _late(self) -> bool:
        return self._stop.is_set() or (self.deadline is not None and time.monotonic() > self.deadline)

    def _lane_safely(self, lane: Lane) -> None:
        try:
            for group in lane.groups:
                self._group(group)
        except Exception as e:  # noqa: BLE001 - one lane's fault is that lane's configurations' failure
            self.say(f"lane on GPU {','.join(map(str, lane.gpus))}: {type(e).__name__}: {e}")
            with self._lock:
                self.failed += [c for g in lane.groups for s in g.servers for c in s.configs
                                if c not in self.failed and not done(self.study, self.root, c)]

    # -- a group of servers on one GPU set ----------------------------------------------------------
    def _group(self, group: Group) -> None:
        todo = [s for s in group.servers if not (self.resume and all(done(self.study, self.root, c) for c in s.configs))]
        for s in group.servers:
            if s not in todo:
                self.say(f"server {s.id}: its configurations are complete, not started (--resume)")
        if not todo:
            return
        if self._late():
            with self._lock:
                self.left += [c for s in todo for c in s.configs]
            return
        for s in todo:  # model directories first, one at a time (one cache folder)
            model_dir_for(s.engine)
        up: dict[str, bool] = {}
        starts = []
        for i, s in enumerate(todo):
            if i and self.placement.stagger_s:
                time.sleep(self.placement.stagger_s)
            t = threading.Thread(target=lambda s=s: up.__setitem__(s.id, self._start(s)), name=f"start-{s.id}",
                                 daemon=True)
            t.start()
            starts.append(t)
        for t in starts:
            t.join()
        for s in todo:
            if up.get(s.id):
                for cid in s.configs:
                    self._config(s, cid)
                self._stop_server(s)
            else:
                with self._lock:
                    self.failed += s.configs

    def _start(self, s: Server) -> bool:
        """Start one server and leave its handle for each of its configurations' launch stage."""
        model_dir = model_dir_for(s.engine)
        eng = Engine(s.engine, model_dir, self.root / ".servers" / s.id)
        with self._lock:
            self.engines[s.id] = eng
        self.say(f"server {s.id}: starting on GPU {','.join(map(str, s.gpus))}, port {s.engine.port}"
                 f"{' (' + eng.python + ')' if eng.python else ''}")
        try:
            eng.start()
        except EngineError as e:
            self.say(f"server {s.id}: {e}")
            with self._lock:
                self.engines.pop(s.id, None)
            for cid in s.configs:  # its log, published beside the runs
                failed = self.root / f"{cid}-failed"
                failed.mkdir(parents=True, exist_ok=True)
                if eng.log_path.exists():
                    (failed / eng.log_path.name).write_bytes(eng.log_path.read_bytes())
            return False
        self.startup_s[s.id] = eng.startup_s or 0.0
        self.say(f"server {s.id}: healthy after {eng.startup_s:.0f} s")
        handle = {**eng.record(), "model_dir": model_dir, "shared": True, "server": s.id, "gpus": list(s.gpus)}
        for cid in s.configs:
            p = served_path(self.study.study, cid)
            p.parent.mkdir(parents=True, exist_ok=True)
            write_json(p, {**handle, "config": cid})
        return True

    def _stop_server(self, s: Server) -> None:
        with self._lock:
            eng = self.engines.pop(s.id, None)
        if eng is None or eng.proc is None:
            return
        try:
            pids = [eng.proc.pid, *(c.pid for c in psutil.Process(eng.proc.pid).children(recursive=True))]
        except psutil.Error:
            pids = [eng.proc.pid]
        eng.stop()
        waited = wait_released(s.gpus, pids)
        self.say(f"server {s.id}: stopped{f', GPU memory released after {waited:.0f} s' if waited >= 1 else ''}")

    # -- one configuration on its running server ------------------------------------------------------
    def _config(self, s: Server, cid: str) -> None:
        rdir = self.root / cid
        if self.resume and done(self.study, self.root, cid):
            self.say(f"configuration {cid}: complete, skipped (--resume)")
            return
        if self._stop.is_set():  # the deadline does not end a started server's work: its start is paid for
            with self._lock:
                self.left.append(cid)
            return
        base, plan = f"http://127.0.0.1:{s.engine.port}", self.plans[cid]
        model = json.loads(served_path(self.study.study, cid).read_text())["model_dir"]
        effective = write_effective(self.study, rdir)
        answers = server_answers(base, model)
        self.say(f"configuration {cid}: on server {s.id} (GPU {','.join(map(str, s.gpus))})")
        self.measuring.add(cid)
        try:
            if cid in self.study.checks:
                for line in run_checks(base, rdir, self.study.checks[cid]):
                    self.say(f"configuration {cid}: {line}")
            else:
                run_config(plan, effective, rdir, notebooks=self.notebooks, reduced=False,
                           resume=self.resume and (rdir / "records.jsonl").exists())
        except (StageFailed, EngineError, RunIncomplete, httpx.HTTPError) as e:
            self.say(f"configuration {cid}: {e}")
            with self._lock:
                self.failed.append(cid)
        finally:
            answers["metrics-after.txt"] = http(base + "/metrics")
            save_answers(rdir, answers)
            if not self._stop.is_set():
                self.measuring.discard(cid)
            elif self.stop_reason:  # a lane slower than the stop's wait for it: its own closing write names the stop
                close_partial(rdir, self.stop_reason, over_partial=True)
        if cid in self.failed:
            return
        self._peers(cid, base, model)
        self._capacity(cid, base)

    def _peers(self, cid: str, base: str, model: str) -> None:
        runs = self.study.peers.get(cid) or []
        if not runs:
            return
        out = self.root / "peer" / cid
        out.mkdir(parents=True, exist_ok=True)
        for run in runs:
            python = engine_python(EngineParams(kind=PEER_ENGINE[run.tool])) or sys.executable
            argv, result = peer_command(run, base, model, out, python=python)
            if result.exists() or self._late():
                continue
            t0 = time.monotonic()
            r = subprocess.run(argv, capture_output=True, text=True, check=False)
            (out / (result.stem + ".log")).write_text(r.stdout[-20000:] + "\n--- stderr\n" + r.stderr[-20000:])
            self.say(f"configuration {cid}: {run.tool} in{run.input_tokens} c={run.concurrency}: exit {r.returncode} "
                     f"in {time.monotonic() - t0:.0f} s")
        save_answers(self.root / cid, {"metrics-after-peers.txt": http(base + "/metrics")})

    def _capacity(self, cid: str, base: str) -> None:
        opts = list(self.study.capacity_runs.get(cid) or [])
        if not opts or self._late():
            return
        out = self.root / f"{cid}-capacity"
        if self.deadline is not None:  # the params' budget, or what the deadline leaves if that is less
            left = max(60, int(self.deadline - time.monotonic()))
            if "--budget-s" in opts:
                i = opts.index("--budget-s")
                opts[i + 1] = str(int(min(float(opts[i + 1]), left)))
            else:
                opts += ["--budget-s", str(left)]
        t0 = time.monotonic()
        r = subprocess.run([sys.executable, "-m", "servelab.cli", "capacity", base, *opts, "--out", str(out)],
                           capture_output=True, text=True, check=False)
        out.mkdir(parents=True, exist_ok=True)
        (out / "capacity.log").write_text(r.stdout[-20000:] + "\n--- stderr\n" + r.stderr[-20000:])
        self.say(f"configuration {cid}: capacity search exit {r.returncode} in {time.monotonic() - t0:.0f} s")


def measure_placed(study: Study, placement: Placement, root: Path, *, notebooks: bool, resume: bool,
                   deadline: float | None = None) -> tuple[list[str], list[str], dict[str, float]]:
    """Every placed configuration measured on its server (see the module docstring); (the configurations that
    failed, those not started before the deadline, each server's start-up seconds)."""
    for line in placement.lines():
        log(line)
    runner = Runner(placed_study(study, placement), placement, root, notebooks=notebooks, resume=resume,
                    deadline=deadline)
    failed = runner.run()
    return failed, runner.left, runner.startup_s


__all__ = ["RECORDED", "Runner", "measure_placed", "placed_study", "server_answers"]
