"""`servelab bench URL --html`: a server that already runs, measured as a one-configuration study and
published as a study page through the path every study takes (`pipeline.run_study`, then
`pipeline.publish`): reports/<name>/index.html with its data/ beside it, re-rendered by
`servelab report <name>` like any other. The study is written out as a params file
(runs/bench/<name>.yaml), so `servelab run` measures it again.

The study attaches to the URL (`host.kind: attach`), names no model and no engine flags: servelab
did not start that engine and knows of it only what the server answers (/v1/models, /version,
/metrics); the page says what it cannot know (`report.attached`). Not for the measurement itself
(`pipeline`, `stages`) nor for the page's words (`report`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from .engines import detect_kind
from .hosts.attach import attach
from .execute import RunIncomplete
from .pipeline import PublishedReportExists, publish, run_study
from .runfolder import reports_root, runs_root
from .schema import AttachParams, Study, Workload

CONFIG_ID = "server"


def model_label(model: str) -> str:
    """How the page names the served model: its name, or the last part of a path (a server started
    with `--model /path/to/dir` serves it under that path)."""
    if not model.startswith(("/", "~", ".")):
        return model
    return next((x for x in reversed(model.split("/")) if x.strip()), model)


def default_name(model: str) -> str:
    """The study name of a bench page: `bench-` and the served model's name as a folder name
    ("HuggingFaceTB/SmolLM2-135M-Instruct" -> "bench-smollm2-135m-instruct")."""
    last = next((x for x in reversed(model.split("/")) if x.strip()), "")
    slug = re.sub(r"[^a-z0-9.]+", "-", last.lower()).strip("-.")
    return f"bench-{slug or 'server'}"


def bench_study(p: AttachParams, workload: Workload, *, name: str | None = None) -> Study:
    """The one-configuration study of the server at `p.url` with `workload`. Asks the server for its
    model (and the engine kind from its /metrics); raises EngineError (one line) when it does not answer."""
    srv = attach(p)
    kind = detect_kind(srv.base_url, srv.headers)
    study = name or default_name(srv.model)
    where, label = srv.base_url.split("://", 1)[-1], model_label(srv.model)
    data = {
        "study": study,
        "title": f"{label} served at {where}: latency and throughput, measured by servelab",
        "description": f"The server that answered at {srv.base_url} (model `{srv.model}`), measured as it ran by "
                       f"`servelab bench {srv.base_url} --html`; servelab did not start it.",
        "host": {"kind": "attach", "attach": json.loads(p.model_dump_json(exclude_defaults=True))},
        "engine": {"kind": kind, "load_format": None},  # no model, no flags: the engine is not servelab's
        "workload": json.loads(workload.model_dump_json(exclude_defaults=True)),
        "reduced": {},
        "configurations": [{"id": CONFIG_ID, "label": label}],
    }
    return Study.model_validate(data)


def write_params(study: Study) -> Path:
    """The study as a params file (runs/bench/<name>.yaml): what the run folder's params.yaml copies
    and what `servelab run` measures again."""
    path = runs_root() / "bench" / f"{study.study}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    body = json.loads(study.model_dump_json(exclude_defaults=True))
    path.write_text("# written by `servelab bench URL --html`\n" + yaml.safe_dump(body, sort_keys=False, allow_unicode=True))
    return path


def bench_page(study: Study, *, out: Path | None = None, force: bool = False) -> Path:
    """Measure the study's server and publish its page: reports/<name>/index.html, or `out`/index.html
    with its data in `out`/data. Returns the page. Raises PublishedReportExists (without --force)
    before anything is measured, RunIncomplete when the measurement did not complete."""
    pub = Path(out) if out is not None else reports_root() / study.study
    if (pub / "index.html").exists() and not force:
        raise PublishedReportExists(f"{pub}/index.html is published: pass --force to replace it")
    params = write_params(study)
    if run_study(study, params, force=force, notebooks=False, report=False) != 0:
        raise RunIncomplete(f"the measurement of {study.host.attach.url} did not complete; its records are in "
                        f"{runs_root() / study.study}")
    return publish(study.study, runs_root() / study.study, force=True, pub=pub)
