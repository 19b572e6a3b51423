"""Study orchestration: every configuration through the stage notebooks, then the report.

`run_study` executes `notebooks/01_provision .. 04_diagnose` headless with papermill for each
configuration (executed copies kept in the run folder), always stopping the engine, then
publishes: raw runs copied to `reports/<study>/data/`, the write-up notebook executed and
converted to `reports/<study>/index.html` with inputs hidden, `reports/index.html` updated.
`render_reports` re-renders published studies from their data alone (no server).
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from . import stages
from .config import Study, load_study
from .engine import EngineError, build_command
from .records import RECORDS, read_json, write_json
from .secrets import scrub_file, scrub_tree

STAGES = ["01_provision", "02_launch", "03_benchmark", "04_diagnose"]
WRITEUP = "05_writeup"
STUDY_JSON = "study.json"


class PublishedReportExists(FileExistsError):
    pass


def notebooks_dir() -> Path:
    return stages.project_root() / "notebooks"


def reports_root() -> Path:
    import os

    return Path(os.environ.get("SERVELAB_REPORTS", stages.project_root() / "reports"))


def _log(msg: str) -> None:
    print(f"[servelab] {msg}", file=sys.stderr, flush=True)


def execute_notebook(name: str, out_dir: Path, parameters: dict[str, Any], *, log_output: bool = False) -> Path:
    """Convert notebooks/<name>.py (jupytext percent) to ipynb and execute it with papermill."""
    import jupytext
    import papermill as pm

    src = notebooks_dir() / f"{name}.py"
    out_dir.mkdir(parents=True, exist_ok=True)
    nb_in = out_dir / f"{name}.input.ipynb"
    nb = jupytext.read(src)
    nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": "python3"}
    nb.metadata.setdefault("language_info", {"name": "python"})
    jupytext.write(nb, nb_in)
    nb_out = out_dir / f"{name}.ipynb"
    try:
        pm.execute_notebook(str(nb_in), str(nb_out), parameters=parameters, kernel_name="python3",
                            cwd=str(stages.project_root()), progress_bar=False, log_output=log_output,
                            request_save_on_cell_execute=True)
    finally:
        nb_in.unlink(missing_ok=True)
        if nb_out.exists():
            scrub_file(nb_out)
    return nb_out


def describe(study: Study) -> str:
    lines = [f"study {study.study}: {study.title}"]
    wl = study.workload
    n = sum((wl.warmup_rounds + wl.rounds) * c * wl.requests_per_round for c in wl.concurrency) * len(wl.buckets)
    lines.append(f"workload: {len(wl.buckets)} buckets x concurrency {wl.concurrency}, "
                 f"{wl.warmup_rounds} warmup + {wl.rounds} rounds, {n} requests per configuration")
    from .aws import aws_plan_lines
    from .cost import cost_estimate_lines
    from .profiles import resolve_profile

    for c in study.configurations:
        eng = resolve_profile(study, c.id)  # derived values (e.g. capture sizes) filled in
        if study.host.kind == "attach":
            lines.append(f"[{c.id}] attach {study.host.attach.url if study.host.attach else '?'}")
        if eng.model is not None:
            model = eng.model.path if eng.model.path else f"<model:{eng.model.preset}>"
            verb = "serve" if study.host.kind == "attach" else "launch"
            lines.append(f"[{c.id}] {verb}: " + " ".join(build_command(eng, model, python="python")))
            if eng.env:
                lines.append(f"[{c.id}] env " + " ".join(f"{k}={v}" for k, v in eng.env.items()))
    lines += aws_plan_lines(study)
    lines += cost_estimate_lines(study)
    return "\n".join(lines)


def run_config(study: Study, params_path: Path, config_id: str, rdir: Path, *, notebooks: bool,
               reduced: bool, resume: bool = False) -> None:
    """One configuration: provision, launch, benchmark, diagnose. The engine always stops."""
    params = {"params_path": str(params_path.resolve()), "config_id": config_id, "run_dir": str(rdir.resolve()),
              "reduced": reduced, "resume": resume}
    if (rdir / stages.ENGINE_JSON).exists():  # an engine left by a killed run would hold the port
        _log(f"{config_id}: leftover engine from an earlier run: {stages.stop(rdir)}")
    try:
        if notebooks:
            for name in STAGES:
                t0 = time.monotonic()
                try:
                    execute_notebook(name, rdir / "notebooks", params)
                except Exception as e:  # papermill wraps the cell's exception
                    raise StageFailed(name, rdir, e) from None
                _log(f"{config_id}: {name} done in {time.monotonic() - t0:.1f} s")
        else:
            stages.provision(study, config_id, rdir)
            stages.launch(study, config_id, rdir)
            res = stages.benchmark(study, config_id, rdir, resume=resume)
            if res.message:
                _log(res.message)
    finally:
        _log(f"{config_id}: {stages.stop(rdir)}")
    run = read_json(rdir / "run.json") if (rdir / "run.json").exists() else {}
    if run.get("status") != "complete":
        raise RunIncomplete(f"{config_id}: run {run.get('status', 'missing')}: {run.get('message', '')} "
                            f"(continue with --resume)")


class RunIncomplete(RuntimeError):
    pass


class StageFailed(RuntimeError):
    def __init__(self, stage: str, rdir: Path, err: Exception) -> None:
        ename = getattr(err, "ename", type(err).__name__)
        evalue = getattr(err, "evalue", str(err))
        super().__init__(f"stage {stage} failed for {rdir.name}: {ename}: {evalue}\n"
                         f"executed notebook: {rdir / 'notebooks' / (stage + '.ipynb')}")


def run_study(study: Study, params_path: Path, *, only: list[str] | None = None, reduced: bool = False,
              force: bool = False, dry_run: bool = False, notebooks: bool = True, report: bool = True,
              resume: bool = False) -> int:
    """Measure every (or `only` the named) configuration, then publish the report. Returns an exit status."""
    if dry_run:
        print(describe(study))
        return 0
    from .summary import format_table, summarize
    from .records import load_records

    if reduced:
        study = study.reduced_copy()
    configs = [c.id for c in study.configurations if not only or c.id in only]
    unknown = set(only or []) - {c.id for c in study.configurations}
    if unknown:
        raise ValueError(f"{params_path}: no configuration {sorted(unknown)}; have {[c.id for c in study.configurations]}")
    pub = reports_root() / study.study
    if report and (pub / "index.html").exists() and not force:
        raise PublishedReportExists(f"{pub}/index.html is published: pass --force to replace it")
    if study.host.kind == "attach":  # an unreachable URL stops before any work
        from .engine import attach

        assert study.host.attach is not None
        attach(study.host.attach)
    root = stages.runs_root() / study.study
    todo = []
    for cid in configs:
        rdir = root / cid
        if resume and (rdir / "run.json").exists() and read_json(rdir / "run.json").get("status") == "complete":
            _log(f"configuration {cid}: complete, skipped (--resume)")
            continue
        if rdir.exists() and not resume:
            if not force:
                raise FileExistsError(f"{rdir} exists (runs are immutable): pass --force to measure again "
                                      "or --resume to continue an interrupted run")
            shutil.rmtree(rdir)
        todo.append(cid)
    root.mkdir(parents=True, exist_ok=True)
    write_json(root / STUDY_JSON, {"params_path": str(params_path), "reduced": reduced,
                                   "study": json.loads(study.model_dump_json())})
    shutil.copy(params_path, root / "params.yaml")
    t0 = time.monotonic()
    failed = []
    try:
        failed = _measure(study, root, todo, notebooks=notebooks, resume=resume)
    finally:
        if study.host.kind.startswith("aws"):  # teardown in every path, also Ctrl-C
            _log(stages.stop_aws(study))
    scrub_tree(root)  # engine logs and anything else written by child processes
    df = load_records([root / c for c in configs])
    print(format_table(summarize(df)))
    _log(f"measured {len(todo) - len(failed)} configuration(s) in {time.monotonic() - t0:.0f} s")
    if failed:
        _log(f"failed: {failed}; records kept under {root}")
        return 1
    if report:
        publish(study.study, root, force=force)
    return 0


def _measure(study: Study, root: Path, todo: list[str], *, notebooks: bool, resume: bool) -> list[str]:
    failed: list[str] = []
    for cid in todo:
        rdir = root / cid
        _log(f"configuration {cid}: {'resume' if resume and rdir.exists() else 'start'}")
        rdir.mkdir(parents=True, exist_ok=True)
        # the notebooks read the study as validated here (--reduced and --url applied)
        effective = rdir / "params.effective.yaml"
        effective.write_text(yaml.safe_dump(json.loads(study.model_dump_json()), sort_keys=False))
        try:
            run_config(study, effective, cid, rdir, notebooks=notebooks, reduced=False,
                       resume=resume and (rdir / RECORDS).exists())
        except (StageFailed, EngineError, RuntimeError) as e:
            _log(str(e))
            failed.append(cid)
            break
    return failed


def publish(study_id: str, run_root: Path, *, force: bool = False) -> Path:
    """Copy raw runs into reports/<study>/data and render the report from that copy."""
    pub = reports_root() / study_id
    data = pub / "data"
    if data.exists():
        if not force and (pub / "index.html").exists():
            raise PublishedReportExists(f"{pub}/index.html is published: pass --force to replace it")
        shutil.rmtree(data)
    data.mkdir(parents=True)
    for f in ("params.yaml", STUDY_JSON):
        if (run_root / f).exists():
            shutil.copy(run_root / f, data / f)
    for failed in run_root.glob("*-failed"):  # logs of configurations that could not be measured
        shutil.copytree(failed, data / failed.name)
    if (run_root / "peer").is_dir():  # peer tools' results (vllm bench serve) measured beside the runs
        shutil.copytree(run_root / "peer", data / "peer")
    for cdir in sorted(p for p in run_root.iterdir() if p.is_dir() and (p / RECORDS).exists()):
        dst = data / cdir.name
        dst.mkdir()
        for f in ("records.jsonl", "run.json", "server_metrics.jsonl", "summary.csv", "engine.log",
                  "client_stats.jsonl", "levels.jsonl"):
            if (cdir / f).exists():
                shutil.copy(cdir / f, dst / f)
        served_log = run_root / ".served" / cdir.name / "engine.log"  # engine started by `servelab serve`
        if served_log.exists() and not (dst / "engine.log").exists():
            shutil.copy(served_log, dst / "engine.log")
    scrub_tree(data)
    render(study_id, keep_dir=run_root)
    return pub / "index.html"


def render(study_id: str, keep_dir: Path | None = None) -> Path:
    """Execute the write-up on reports/<study>/data and write index.html (inputs hidden).

    The executed notebook is kept in `keep_dir` when given (nbval checks it), else discarded.
    """
    import tempfile

    from .report import notebook_to_html, write_index

    pub = reports_root() / study_id
    if not (pub / "data").exists():
        raise FileNotFoundError(f"{pub / 'data'} does not exist: nothing to render")
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="servelab-render-") as tmp:
        work = Path(keep_dir) if keep_dir else Path(tmp)
        nb = execute_notebook(WRITEUP, work, {"study_dir": str(pub.resolve())})
        title = read_json(pub / "data" / STUDY_JSON)["study"].get("title", study_id)
        notebook_to_html(nb, pub / "index.html", title=title)
    write_index(reports_root())
    _log(f"report {pub / 'index.html'} rendered in {time.monotonic() - t0:.1f} s")
    return pub / "index.html"


def render_reports(study_id: str | None) -> int:
    root = reports_root()
    ids = [study_id] if study_id else sorted(p.name for p in root.iterdir() if (p / "data").is_dir())
    if not ids:
        _log(f"no published study under {root}")
        return 1
    for s in ids:
        render(s)
    return 0


def load(params_path: str | Path, reduced: bool = False) -> Study:
    s = load_study(params_path)
    return s.reduced_copy() if reduced else s
