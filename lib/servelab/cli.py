"""The `servelab` command line: model make, bench, run, validate, report.

Errors a user can fix (bad params, unreachable server, engine that will not start) print one
clear message and exit non-zero; no traceback. Not for logic: every command calls the library.

Lazy dispatch: the light modules a command uses are imported at the top; the heavy ones (pandas,
matplotlib, the measurement client, the pipeline) are `_LazyModule`s, imported on a command's first
use of them, so `servelab --help` and the light commands load only argparse, the schema and the
cli_* parsers. `servelab aws` is registered only where boto3 is installed (the GPU device's image
has none), so cli_aws is imported inside `parser`.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
from datetime import datetime
from pathlib import Path
from types import ModuleType
from typing import Any

from .cli_capacity import add_parser as add_capacity_parser
from .cli_predict import add_parser as add_predict_parser
from .errors import ServelabError, UserError
from .explain import explain, run_followups
from .log import set_level
from .models import list_presets, make_model, model_facts
from .models.reference import reference_answers, ship
from .schema import AttachParams, Bucket, ParamsError, Workload, WorkloadBlock, load_params, load_study


class _LazyModule:
    """A servelab module imported on the first use of one of its names (see the module docstring)."""

    def __init__(self, name: str) -> None:
        self._name = name

    def _module(self) -> ModuleType:
        return importlib.import_module(f".{self._name}", __package__)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._module(), attr)


_attach = _LazyModule("hosts.attach")
_bench = _LazyModule("bench")
_compare = _LazyModule("results.compare")
_hosts = _LazyModule("hosts")
_importer = _LazyModule("results.importer")
_inventory = _LazyModule("measure.inventory")
_pages = _LazyModule("results.pages")
_pipeline = _LazyModule("pipeline")
_preflight = _LazyModule("preflight")
_quality = _LazyModule("measure.quality")
_runinfo = _LazyModule("measure.runinfo")
_runner = _LazyModule("measure.runner")
_selfcheck = _LazyModule("measure.selfcheck")
_summary = _LazyModule("summary")
_trace = _LazyModule("measure.sources.trace")
_traffic = _LazyModule("analysis.traffic")
_tune = _LazyModule("tune")

EXIT_USAGE = 2
EXIT_FAIL = 1


def _ints(s: str) -> list[int]:
    try:
        return [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {s!r}") from None


def cmd_model(a: argparse.Namespace) -> int:

    if a.action == "list":
        for p in list_presets():
            print(p)
        return 0
    if a.action == "reference":
        return _model_reference(a)
    t0 = time.monotonic()
    d = make_model(a.preset, Path(a.root) if a.root else None, force=a.force)
    f = model_facts(d)
    print(f"{d}  ({f.get('architecture')}, {f.get('param_count', 0) / 1e6:.1f} M params, {time.monotonic() - t0:.1f} s)")
    return 0


def _model_reference(a: argparse.Namespace) -> int:
    """The model's own answers (transformers, float32, greedy) to a study's quality prompts."""

    d = make_model(a.preset)
    qp = load_study(Path(a.params)).quality
    chosen = _quality.selected_prompts(qp.sets, qp.prompts_per_set)
    ref = reference_answers(d, [(f"{s}/{p.id}", p.chat()) for s, p in chosen], qp.max_tokens, shipped=not a.ship)
    print(f"{len(ref['answers'])} answers at most {ref['max_tokens']} tokens ({ref['implementation']}, "
          f"{ref['computed_on']}, {ref['computed_at']})")
    if a.ship:
        print(f"shipped: {ship(d, ref)}")
    return 0


def cmd_validate(a: argparse.Namespace) -> int:

    bad = 0

    for p in a.params:
        try:
            s = load_params(p)
            if isinstance(s, WorkloadBlock):
                print(f"{p}: ok (a workload block: {len(s.workload.buckets)} buckets)")
                continue
            if s.reduced:  # `--reduced` (CI's size) must load too
                try:
                    s.reduced_copy()
                except ValueError as e:
                    raise ParamsError(f"{p}: its `reduced` block makes an invalid study: {e}") from e
            warned = _preflight.preflight(s, p, warn=lambda line: print(line, file=sys.stderr))
            note = f", {len(warned)} warnings" if warned else ""
            print(f"{p}: ok ({s.study}: {len(s.configurations)} configurations{note})")
        except ParamsError as e:
            print(str(e), file=sys.stderr)
            bad += 1
    return EXIT_FAIL if bad else 0


def cmd_workload(a: argparse.Namespace) -> int:
    p = Path(a.file)
    log = "" if p.suffix.lower() == ".csv" else p.read_text()
    kind = _traffic.trace_kind(p.suffix, log)
    obs = _traffic.from_trace(_trace.read_trace(p)) if kind else _traffic.from_log(log, a.file)
    text = _traffic.workload_yaml(obs, kind or "request log", p.name, a.buckets)
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(text)
        print(f"{a.out}: workload block from {a.file}")
    else:
        print(text, end="")
    return 0


def cmd_bench(a: argparse.Namespace) -> int:

    headers = dict(h.split(":", 1) for h in a.header) if a.header else {}
    headers = {k.strip(): v.strip() for k, v in headers.items()}
    ap = AttachParams(url=a.url, model=a.model, headers=headers, api_key_env=a.api_key_env, tokenizer=a.tokenizer)
    wl = Workload(api=a.api, buckets=[Bucket(input_tokens=i, output_tokens=a.output) for i in a.input],
                  concurrency=a.concurrency, warmup_rounds=a.warmup, rounds=a.rounds,
                  requests_per_round=a.requests_per_round, timeout_s=a.timeout)
    if a.html:  # a one-configuration study, measured and published as a study page (servelab.bench)
        page = _bench.bench_page(_bench.bench_study(ap, wl, name=a.name), out=a.out and Path(a.out), force=a.force)
        print(f"page: {page}")
        return 0
    srv = _attach.attach(ap)
    out = Path(a.out or Path("runs") / "bench" / datetime.now().strftime("%Y%m%d-%H%M%S"))
    res = _runner.run_workload(srv, wl, out, study="bench", config_id=out.name, record=_runinfo.base_record("bench", out.name),
                       progress=not a.quiet)
    print(_summary.format_table(res.summary))
    print(f"records: {out}/records.jsonl ({res.records}), status {res.status}")
    if res.message:
        print(res.message, file=sys.stderr)
    return 0 if res.status == "complete" else EXIT_FAIL


def cmd_run(a: argparse.Namespace) -> int:

    study = load_study(a.params)
    if a.url:

        try:
            study = _hosts.with_url(study, a.url)
        except ValueError as e:
            raise ParamsError(f"{a.params}: {e}") from None
    if study.tune is not None:  # a search over configurations (servelab.tune)

        return _tune.run_tune(study, Path(a.params), force=a.force, resume=a.resume, dry_run=a.dry_run,
                        report=not a.no_report)
    if a.gpus:  # a machine one does not have: its placement shown, nothing started
        if not a.dry_run:
            raise UserError("--gpus describes another machine's GPUs: it goes with --dry-run only")
        os.environ[_inventory.FAKE_ENV] = a.gpus
        _inventory.stand_in(a.gpus)  # a spec it cannot read: one line now
    only = [c for arg in a.config or [] for c in arg.split(",") if c.strip()] or None
    rc = _pipeline.run_study(study, Path(a.params), only=only, reduced=a.reduced, force=a.force,
                   dry_run=a.dry_run, notebooks=not a.no_notebooks, report=not a.no_report, resume=a.resume,
                   stop_after_s=a.stop_after)
    fu = study.followups
    if rc == 0 and fu is not None and fu.enabled and not a.no_report and not a.reduced and not a.config:
        # `followups:` in the study: explain every surprise in its budget

        rc = run_followups(study.study, budget_s=fu.budget_s, max_studies=fu.max_studies, force=a.force,
                           dry_run=a.dry_run)
    return rc


def cmd_serve(a: argparse.Namespace) -> int:
    """Start (or stop) a configuration's engine detached, for studies that attach to it."""

    study = load_study(a.params)
    if a.stop:
        print(f"{a.config}: {_attach.stop_served(study.study, a.config)}")
        return 0
    env = dict(e.split("=", 1) for e in a.env or [])
    h = _attach.serve(study, a.config, port=a.port, env=env)
    print(f"{a.config}: serving on {h['base_url']} (pid {h['pid']}, healthy after {h['startup_s']:.0f} s)")
    return 0


def cmd_report(a: argparse.Namespace) -> int:

    if not a.all and not a.study:
        print("servelab report: give a study name or --all", file=sys.stderr)
        return EXIT_USAGE
    return _pipeline.render_reports(None if a.all else a.study)


def cmd_explain(a: argparse.Namespace) -> int:
    """Follow-up sweeps for a surprise of a published study (servelab.explain)."""

    return explain(a.study, a.config, dry_run=a.dry_run, budget_s=a.budget_s, force=a.force)


def cmd_import(a: argparse.Namespace) -> int:
    """Other tools' result files as a run folder (servelab.results.importer)."""

    res = _importer.import_files(a.files, tool=a.tool, out=a.out, study=a.study, config=a.config, bucket=a.bucket,
                       force=a.force)
    print(res.line())
    return 0


def cmd_compare(a: argparse.Namespace) -> int:
    """Two runs (or two studies) under the verdict machinery, and a page (servelab.results.compare)."""

    res = _compare.compare(a.run_a, a.run_b, between_sd_pct=a.between_sd_pct, between_run_sd_pct=a.between_run_sd_pct)
    for line in res.lines():
        print(line)
    html = Path(a.html or Path("runs") / "compare" / f"{Path(a.run_a).name}-vs-{Path(a.run_b).name}.html")
    print(f"page: {_pages.compare_page(res, html, a.title)}")
    return 0


def cmd_calibrate(a: argparse.Namespace) -> int:
    """Client self-check against the reference server (servelab.measure.selfcheck)."""

    out = Path(a.out or Path("runs") / "selfcheck" / f"{datetime.now():%Y%m%d-%H%M%S}.json")
    df = _selfcheck.calibrate(levels=a.levels, ttft_s=a.ttft, itl_s=a.itl, tokens=a.tokens, workers=a.workers,
                   backend="ray" if a.ray or a.ray_address else "local", ray_address=a.ray_address,
                   server_process=not a.in_process, tokens_per_chunk=a.tokens_per_chunk, api=a.api,
                   port=a.port, uvloop_server=a.server_uvloop,
                   late_ms=a.late_ms, out=out)
    print(f"self-check: {out}")
    return 0 if len(df) else EXIT_FAIL


def _add_model_parser(sub: Any) -> None:
    """`servelab model make|list|reference`: offline model directories."""
    m = sub.add_parser("model", help="offline model directories")
    msub = m.add_subparsers(dest="action", required=True)
    mk = msub.add_parser("make", help="build (or reuse) a model directory from a preset")
    mk.add_argument("preset")
    mk.add_argument("--root", help="cache folder (default .cache/servelab/models)")
    mk.add_argument("--force", action="store_true")
    msub.add_parser("list", help="list presets")
    mr = msub.add_parser("reference", help="the model's own answers (transformers, float32) to a study's quality prompts")
    mr.add_argument("preset")
    mr.add_argument("--params", default="params/local-cpu.yaml", help="the study whose quality prompts (default: %(default)s)")
    mr.add_argument("--ship", action="store_true", help="copy them into lib/servelab/data/references (maintainers)")
    m.set_defaults(fn=cmd_model)


def _add_params_parsers(sub: Any) -> None:
    """`servelab validate|workload`: params files, and workload blocks from observed traffic."""
    v = sub.add_parser("validate", help="validate params files")
    v.add_argument("params", nargs="+")
    v.set_defaults(fn=cmd_validate)

    w = sub.add_parser("workload", help="workload blocks from observed traffic")
    wsub = w.add_subparsers(dest="action", required=True)
    fl = wsub.add_parser("from-log", help="propose a workload: block from an OpenAI-style request log "
                         "(JSONL with messages and usage) or a trace (Azure CSV, Mooncake JSONL)")
    fl.add_argument("file", help="the log or trace file")
    fl.add_argument("--buckets", type=int, default=3, help="buckets at input-length quantiles (default 3)")
    fl.add_argument("--out", help="write the block here (default: print it)")
    w.set_defaults(fn=cmd_workload)


def _add_bench_parser(sub: Any) -> None:
    """`servelab bench URL`: one workload against a running server."""
    b = sub.add_parser("bench", help="benchmark a running OpenAI-compatible server")
    b.add_argument("url")
    b.add_argument("--model")
    b.add_argument("--api", choices=["chat", "completions"], default="chat")
    b.add_argument("--input", type=_ints, default=[256], help="prompt tokens, e.g. 256,2048")
    b.add_argument("--output", type=int, default=128, help="output tokens per request")
    b.add_argument("--concurrency", type=_ints, default=[1], help="e.g. 1,2,4")
    b.add_argument("--warmup", type=int, default=2)
    b.add_argument("--rounds", type=int, default=5)
    b.add_argument("--requests-per-round", type=int, default=1, help="multiple of the concurrency")
    b.add_argument("--timeout", type=float, default=300.0)
    b.add_argument("--header", action="append", help="extra header 'Name: value' (repeatable)")
    b.add_argument("--api-key-env", help="environment variable holding the API key")
    b.add_argument("--tokenizer", help="local tokenizer dir when the server has no /tokenize")
    b.add_argument("--out", help="run folder (default runs/bench/<timestamp>); with --html the page's folder "
                   "(index.html and its data/; default reports/<name>)")
    b.add_argument("--html", action="store_true",
                   help="measure the server as a one-configuration study and publish its page (reports/<name>/index.html)")
    b.add_argument("--name", help="with --html: the study's name (default bench-<model>)")
    b.add_argument("--force", action="store_true", help="with --html: replace an earlier run and page of that name")
    b.add_argument("--quiet", action="store_true")
    b.set_defaults(fn=cmd_bench)


def _add_study_parsers(sub: Any) -> None:
    """`servelab run|serve|report`: a study, its engines, its published report."""
    r = sub.add_parser("run", help="run a study: every configuration, then the report")
    r.add_argument("params")
    r.add_argument("--config", action="append", help="only these configuration ids (comma-separated, repeatable)")
    r.add_argument("--reduced", action="store_true", help="smallest workload (CI): 1 round, no warmup")
    r.add_argument("--force", action="store_true", help="replace existing runs and the published report")
    r.add_argument("--dry-run", action="store_true", help="print what would run, start nothing")
    r.add_argument("--resume", action="store_true",
                   help="continue an interrupted run from its first incomplete level (completed levels are kept)")
    r.add_argument("--no-notebooks", action="store_true", help="call the stages directly, no papermill")
    r.add_argument("--no-report", action="store_true", help="measure only")
    r.add_argument("--url", help="override host.attach.url (attach studies)")
    r.add_argument("--gpus", metavar="COUNTxNAME", help="with --dry-run: place the study on these GPUs instead of this "
                   "machine's (e.g. 8xH100, 2xH200: the hardware table's memory)")
    r.add_argument("--stop-after", type=float, metavar="SECONDS", help="on GPUs: start no server after this many "
                   "seconds (a started one measures its configurations); the page is published from what was "
                   "measured (exit status 3) and --resume continues with the rest")
    r.set_defaults(fn=cmd_run)

    sv = sub.add_parser("serve", help="start a configuration's engine detached (for attach studies)")
    sv.add_argument("params")
    sv.add_argument("--config", required=True)
    sv.add_argument("--port", type=int, help="override engine.port")
    sv.add_argument("--env", action="append", help="extra NAME=value for the engine (e.g. CUDA_VISIBLE_DEVICES=1)")
    sv.add_argument("--stop", action="store_true", help="stop the engine started for this configuration")
    sv.set_defaults(fn=cmd_serve)

    rep = sub.add_parser("report", help="re-render published reports from their data/ (no server)")
    rep.add_argument("study", nargs="?")
    rep.add_argument("--all", action="store_true")
    rep.set_defaults(fn=cmd_report)


def _add_calibrate_parser(sub: Any) -> None:
    """`servelab calibrate`: the client's own error against the reference server."""
    cal = sub.add_parser("calibrate", help="client self-check: servelab's error against the reference server")
    cal.add_argument("--levels", type=_ints, default=[1, 4, 16, 64, 256, 512, 1024], help="concurrent streams")
    cal.add_argument("--ttft", type=float, default=0.1, help="programmed TTFT (s)")
    cal.add_argument("--itl", type=float, default=0.02, help="programmed inter-token gap (s)")
    cal.add_argument("--tokens", type=int, default=64, help="output tokens per request")
    cal.add_argument("--tokens-per-chunk", type=int, default=1)
    cal.add_argument("--workers", type=int, default=1, help="client processes (with --ray: Ray actors)")
    cal.add_argument("--ray", action="store_true", help="client workers as Ray actors (needs the ray extra)")
    cal.add_argument("--ray-address", help="Ray cluster: auto, ray://host:10001 (implies --ray; default: a local Ray)")
    cal.add_argument("--api", choices=["chat", "completions"], default="chat")
    cal.add_argument("--port", type=int, help="reference server port (default: first free from 8050)")
    cal.add_argument("--late-ms", type=float, default=5.0, help="a chunk arriving this late is counted late")
    cal.add_argument("--in-process", action="store_true", help="run the reference server in a thread here")
    cal.add_argument("--server-uvloop", action="store_true",
                     help="reference server on uvloop (more streams per core, coarser timers)")
    cal.add_argument("--out", help="result JSON (default runs/selfcheck/<timestamp>.json)")
    cal.set_defaults(fn=cmd_calibrate)


def _add_results_parsers(sub: Any) -> None:
    """`servelab explain|import|compare`: follow-ups, other tools' results, comparisons."""
    ex = sub.add_parser("explain", help="follow-up sweeps that explain a surprise of a published study")
    ex.add_argument("study", help="a published study (reports/<study>)")
    ex.add_argument("config", help="the configuration whose change surprised")
    ex.add_argument("--dry-run", action="store_true", help="print the planned sweeps; start nothing")
    ex.add_argument("--budget-s", type=float, help="time budget of the follow-up study (design.budget_s)")
    ex.add_argument("--force", action="store_true", help="replace an earlier follow-up")
    ex.set_defaults(fn=cmd_explain)

    im = sub.add_parser("import", help="other tools' result files (AIPerf, GuideLLM, vllm bench, SGLang) as a run folder")
    im.add_argument("files", nargs="+", help="result files of one tool (each run in them is one round of its level)")
    im.add_argument("--tool", choices=["aiperf", "guidellm", "vllm-bench", "sglang-bench"],
                    help="the format the files must be (default: detected)")
    im.add_argument("--out", help="the run folder to write (default runs/<study>/<config>, else runs/imported/...)")
    im.add_argument("--study", help="study id: the run folder is runs/<study>/<config>")
    im.add_argument("--config", help="configuration id of the run folder")
    im.add_argument("--bucket", help="bucket label of every level (default in<input>-out<output>)")
    im.add_argument("--force", action="store_true", help="replace an existing run folder")
    im.set_defaults(fn=cmd_import)

    cp = sub.add_parser("compare", help="two runs or two studies, level by level: faster / slower / no detectable change")
    cp.add_argument("run_a", help="run folder or study folder (reports/<study>, runs/<study>): the baseline")
    cp.add_argument("run_b", help="run folder or study folder compared with it")
    cp.add_argument("--between-sd-pct", type=float,
                    help="variance between engine starts (sd %%) measured elsewhere, when neither study repeats a start")
    cp.add_argument("--between-run-sd-pct", type=float,
                    help="variance between runs (sd %%) measured by repeated runs, when two runs share no setting")
    cp.add_argument("--html", help="the page to write (default runs/compare/<A>-vs-<B>.html)")
    cp.add_argument("--title", help="the page's title")
    cp.set_defaults(fn=cmd_compare)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="servelab", description="Reproducible LLM serving benchmarks")
    p.add_argument("--quiet", action="store_true", help="warnings and errors only (no progress lines)")
    p.add_argument("--verbose", action="store_true", help="debug lines too")
    p.add_argument("--debug", action="store_true", help="show the traceback of an error instead of one line")
    sub = p.add_subparsers(dest="cmd", required=True)

    _add_model_parser(sub)
    _add_params_parsers(sub)
    _add_bench_parser(sub)
    _add_study_parsers(sub)
    _add_calibrate_parser(sub)
    _add_results_parsers(sub)
    add_capacity_parser(sub)  # servelab capacity URL
    add_predict_parser(sub)  # servelab calibrate-hw, servelab predict PARAMS

    try:  # boto3 is a dependency; the GPU device's image lacks it, and needs no aws commands
        from .cli_aws import add_parser as add_aws_parser
    except ImportError:
        pass
    else:
        add_aws_parser(sub)  # servelab aws up|start|status|logs|tunnel|down
    return p


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)

    set_level(quiet=a.quiet, verbose=a.verbose)
    if a.debug:  # the traceback of any error, for a bug report
        return a.fn(a)
    try:
        return a.fn(a)
    except ParamsError as e:  # the params file is wrong: its message names the file and key
        print(str(e), file=sys.stderr)
        return EXIT_USAGE
    except UserError as e:  # what was asked cannot be done as asked (a missing extra, a folder that exists)
        print(f"servelab {a.cmd}: {e}", file=sys.stderr)
        return EXIT_USAGE
    except ServelabError as e:  # everything else servelab raises on purpose (an engine, a server)
        print(f"servelab {a.cmd}: {e}", file=sys.stderr)
        return EXIT_FAIL
    except (FileExistsError, FileNotFoundError, ValueError) as e:  # bad input met as built-ins (pydantic, yaml)
        print(f"servelab {a.cmd}: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"servelab {a.cmd}: interrupted; finished records are kept", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
