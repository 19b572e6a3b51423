"""Executing the stage notebooks: papermill on a jupytext notebook from the repository root (the
executed copy kept, scrubbed), their `[servelab]` lines forwarded to the terminal, a stage's failure
as `StageFailed`, and the stop signals (SIGTERM, SIGHUP -> `Stopped`, as Ctrl-C) with what a stop
leaves to close: the kernels this process started, a run.json still "running". `run_stage` is the one
way to run a stage: its notebook, or its stage functions directly (`StageParams` either way). Not for
deciding what runs (`pipeline`, `sidebyside`).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from . import stages
from .errors import ServelabError
from .log import progress_line
from .measure.runfiles import finalize
from .plan import ConfigPlan
from .runfolder import ENGINE_JSON, RECORDS, RunFolder, project_root
from .secrets import scrub_file

STAGES = ["01_provision", "02_launch", "03_benchmark", "04_diagnose"]
WRITEUP = "05_writeup"



class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP arrived: end the run as Ctrl-C does (a KeyboardInterrupt, so every
    `finally` runs), with the signal's name as the reason. A signal, not an error: the one
    exception class outside `ServelabError` (an `except Exception` must not swallow it)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


def log(msg: str) -> None:
    progress_line(msg)


@contextlib.contextmanager
def stop_signals() -> Iterator[None]:
    """SIGTERM / SIGHUP -> `Stopped` in the main thread while a run is in progress."""

    def handler(signum: int, frame: Any) -> None:
        raise Stopped(signal.Signals(signum).name)

    old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


class _ServelabLines(logging.Handler):
    """Forwards the `[servelab]` lines a stage notebook prints (one per load level) to the terminal
    while papermill runs it."""

    def emit(self, record: logging.LogRecord) -> None:
        for line in record.getMessage().splitlines():
            if line.startswith("[servelab]"):
                print(line, file=sys.stderr, flush=True)


def _kernel_manager_class() -> Any:
    """A kernel manager on IPC sockets: the kernel and papermill talk through files in the
    runtime folder, not TCP on localhost (and the kernel's 'running over TCP without
    encryption' warning does not reach the terminal)."""
    from jupyter_client.manager import AsyncKernelManager  # with papermill: only a run that executes notebooks
    from traitlets import CaselessStrEnum, default

    class IpcKernelManager(AsyncKernelManager):
        transport = CaselessStrEnum(["tcp", "ipc"], default_value="ipc", config=True)

        @default("ip")
        def _ip_default(self) -> str:
            # jupyter_client's default is `kernel-ipc` in the working folder, numbered by the first
            # free file: two processes starting kernels at once (`report --all`, two runs in one
            # checkout) took the same sockets ("Invalid Signature"). One unique prefix per kernel.
            return str(Path(tempfile.gettempdir()) / f"servelab-kernel-{uuid.uuid4().hex[:16]}")

        async def _async_interrupt_kernel(self) -> None:
            # jupyter_client interrupts the kernel before every shutdown; an idle kernel then logs
            # "ERROR | KeyboardInterrupt caught in kernel." on the terminal. A notebook papermill
            # has finished runs nothing to interrupt.
            if self.shutting_down:
                return
            await super()._async_interrupt_kernel()

    return IpcKernelManager


def notebooks_dir() -> Path:
    return project_root() / "notebooks"


def execute_notebook(name: str, out_dir: Path, parameters: dict[str, Any], *, out_name: str | None = None,
                     save_each_cell: bool = True) -> Path:
    """Execute notebooks/<name>.py (jupytext percent, kernelspec in its header) with papermill
    from the repository root; the executed copy is written scrubbed to out_dir/<name>.ipynb.

    `save_each_cell` writes the notebook after every cell (a stage interrupted mid-run keeps what its
    cells printed); a write-up, which measures nothing, is written once at the end: the saves were
    a fifth of a page's render time (4.5 s of 25 s for the default study's two pages)."""
    import jupytext  # jupytext and papermill are slow to import: only a run that executes notebooks pays
    import papermill as pm

    src = notebooks_dir() / f"{name}.py"
    out_dir.mkdir(parents=True, exist_ok=True)
    nb_in = out_dir / f"{out_name or name}.input.ipynb"
    jupytext.write(jupytext.read(src), nb_in)
    nb_out = out_dir / f"{out_name or name}.ipynb"
    plog = logging.getLogger("papermill")
    handler = _ServelabLines()
    plog.addHandler(handler)
    plog.setLevel(logging.INFO)
    plog.propagate = False
    try:
        pm.execute_notebook(str(nb_in), str(nb_out), parameters=parameters, kernel_name="python3",
                            language="python", cwd=str(project_root()), progress_bar=False, log_output=True,
                            request_save_on_cell_execute=save_each_cell, kernel_manager_class=_kernel_manager_class())
    finally:
        plog.removeHandler(handler)
        nb_in.unlink(missing_ok=True)
        if nb_out.exists():
            scrub_file(nb_out)
    return nb_out



def close_partial(rdir: Path, reason: str, *, over_partial: bool = False) -> None:
    """A stage process died with the run still 'running' (a signal reached only us): write the
    summary and a partial run.json with the reason from the records on disk. `over_partial`: also where the
    run ended partial or failed for a reason the stop caused (its server stopped by it, the client's requests then
    refused: the stop is the reason, and what was measured is kept for --resume)."""
    rf = RunFolder(rdir)
    if rf.run.get("status") == "running" or (over_partial and rf.run.get("status") in ("partial", "failed")):
        finalize(rf, dict(rf.run), status="partial", message=f"stopped by {reason}; "
                 f"{len(rf.records)} records kept in {rf / RECORDS} (continue with --resume)")


def stop_children() -> None:
    """End the papermill kernels this process started (a signal may leave one running)."""
    procs = psutil.Process().children(recursive=True)
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    _, alive = psutil.wait_procs(procs, timeout=10)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()



class StageFailed(ServelabError, RuntimeError):
    def __init__(self, stage: str, rdir: Path, err: Exception | None = None) -> None:
        if err is None:  # rebuilt in the parent of a worker process (`__reduce__`): the message as it was
            super().__init__(stage)
            return
        ename = getattr(err, "ename", type(err).__name__)
        evalue = getattr(err, "evalue", str(err))
        super().__init__(f"stage {stage} failed for {rdir.name}: {ename}: {evalue}\n"
                         f"executed notebook: {rdir / 'notebooks' / (stage + '.ipynb')}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), Path()))


@dataclass(frozen=True)
class StageParams:
    """A stage's parameters, typed: papermill injects them into the notebook's first cell (the notebook
    rebuilds its plan from `params_path`, the run folder's study file); the direct path has the plan."""

    params_path: Path
    config_id: str
    run_dir: Path
    reduced: bool = False
    resume: bool = False  # 03_benchmark: continue an interrupted run from its first incomplete level
    start: bool = True  # 02_launch, 03_benchmark: start the engine, send the load (False: show the plan)
    check_quality: bool = True  # 02_launch: answer the quality set once up (False: the interleaved benchmark does)
    configs: tuple[str, ...] = ()  # 03_benchmark: the configurations measured together, interleaved
    deadline_unix: float = 0.0  # 03_benchmark: when the study's time budget ends (0: no budget)

    def papermill(self, name: str) -> dict[str, Any]:
        """The parameters notebook `name` declares."""
        out = {"params_path": str(Path(self.params_path).resolve()), "config_id": self.config_id,
               "run_dir": str(Path(self.run_dir).resolve()), "reduced": self.reduced, "resume": self.resume,
               "start": self.start}
        if name == STAGES[1]:
            out["check_quality"] = self.check_quality
        if name == STAGES[2]:
            out |= {"configs": list(self.configs), "deadline_unix": self.deadline_unix}
        return out


def _provision(plan: ConfigPlan, p: StageParams, together: Sequence[ConfigPlan]) -> None:
    stages.provision(plan, p.run_dir)


def _launch(plan: ConfigPlan, p: StageParams, together: Sequence[ConfigPlan]) -> None:
    stages.launch(plan, p.run_dir)
    if p.check_quality:
        stages.quality(plan, p.run_dir)


def _benchmark(plan: ConfigPlan, p: StageParams, together: Sequence[ConfigPlan]) -> None:
    if p.configs:  # the quality checks, then the interleaved benchmark
        rdirs = [p.run_dir.parent / c for c in p.configs]
        _, took = stages.quality_all(list(together), rdirs)
        stages.benchmark_interleaved(list(together), rdirs, deadline_unix=p.deadline_unix or None, quality_s=took)
        return
    res = stages.benchmark(plan, p.run_dir, resume=p.resume, progress=False)
    if res.message:
        log(res.message)


def _diagnose(plan: ConfigPlan, p: StageParams, together: Sequence[ConfigPlan]) -> None:
    """04_diagnose shows what the run's files hold: without a notebook there is nothing to do."""


DIRECT = dict(zip(STAGES, (_provision, _launch, _benchmark, _diagnose)))


def run_stage(name: str, plan: ConfigPlan | None, p: StageParams, *, notebooks: bool,
              together: Sequence[ConfigPlan] = (), where: Path | None = None) -> None:
    """Stage `name` of configuration `plan`: its notebook executed headless (into `where`, default the run
    folder's notebooks/; the kernel rebuilds the plan, which may be None), or with `notebooks` False its
    stage functions called directly. `together`: the plans of `p.configs` (an interleaved benchmark). A
    stage's failure in a notebook is `StageFailed`."""
    if not notebooks:
        assert plan is not None, "the direct path runs the plan it is given"
        DIRECT[name](plan, p, together)
        return
    try:
        execute_notebook(name, where or Path(p.run_dir) / "notebooks", p.papermill(name))
    except KeyboardInterrupt:
        raise
    except Exception as e:  # papermill wraps the cell's exception
        raise StageFailed(name, Path(p.run_dir), e) from None


def run_config(plan: ConfigPlan, params_path: Path, rdir: Path, *, notebooks: bool,
               reduced: bool, resume: bool = False) -> None:
    """One configuration: provision, launch, benchmark, diagnose. The engine always stops.
    With notebooks, each stage kernel rebuilds the plan from `params_path` (the run folder's
    study file); without, the stages get `plan` itself."""
    host, config_id = plan.host, plan.config_id
    p = StageParams(params_path, config_id, rdir, reduced=reduced, resume=resume)
    if (rdir / ENGINE_JSON).exists():  # an engine left by a killed run would hold the port
        log(f"{config_id}: leftover engine from an earlier run: {host.stop(rdir)}")
    try:
        for name in STAGES:
            t0 = time.monotonic()
            run_stage(name, plan, p, notebooks=notebooks)
            if notebooks:
                log(f"{config_id}: {name} done in {time.monotonic() - t0:.1f} s")
    except KeyboardInterrupt as e:
        reason = e.name if isinstance(e, Stopped) else "the user (Ctrl-C)"
        stop_children()
        close_partial(rdir, reason)
        raise
    finally:
        log(f"{config_id}: {host.stop(rdir)}")
    run = RunFolder(rdir).run
    if run.get("status") != "complete":
        raise RunIncomplete(f"{config_id}: run {run.get('status', 'missing')}: {run.get('message', '')} "
                            f"(continue with --resume)")


class RunIncomplete(ServelabError, RuntimeError):
    """A configuration's run ended partial or failed (its records are kept: --resume continues)."""
