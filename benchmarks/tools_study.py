"""The tools study's measurements (issue 34, reports/local-cpu-tools): one vLLM CPU server (SmolLM2-135M
eager, real weights, prefix caching off), measured by servelab, AIPerf 0.13, GuideLLM 0.8 and
`vllm bench serve` with one workload: chat, 128 prompt tokens, 64 output tokens (ignore_eos), at
concurrency 1 and 4, repeated (`--rep 0`, `--rep 1`) with the tools in rotating order, so drift on the
machine hits every tool alike. Each tool writes its own result files under OUT/raw/<tool>/r<rep>-c<conc>/;
`--publish STUDY_DIR` then turns them into the study's run folders (`servelab import` for the peer tools; the
servelab runs of each repetition merged into one run folder, a repetition per round) and renders its page.

The peer tools live in venvs of their own (scripts/setup-tools.sh: .cache/tools/<tool>/). AIPerf
resolves a tokenizer path through the hub's snapshot cache when HF_HUB_OFFLINE is set, so it runs
without it (a local path never reaches the hub: its alias resolution stops at a path); the others
run with HF_HUB_OFFLINE=1. AIPerf runs as shipped (one worker, one record processor): at its concurrency
limit its timing manager yields to the event loop in a loop (`request_rate.py`, CONCURRENCY_BURST) and keeps
most of a core busy beside the engine on this 2-core host; each tool's CPU seconds (its process tree) and
the engine's during its run are recorded in times.json, which the page shows.

One repetition per call (`--rep K`), each on a fresh engine start, so that one hold of the machine's lock
stays under ten minutes; the tools take turns in an order rotated by the repetition.

    flock /tmp/servelab-cpu.lock .venv/bin/python benchmarks/tools_study.py --out runs/tools-raw --rep 0
    flock /tmp/servelab-cpu.lock .venv/bin/python benchmarks/tools_study.py --out runs/tools-raw --rep 1
    .venv/bin/python benchmarks/tools_study.py --out runs/tools-raw --publish reports/local-cpu-tools \
        --rerun runs/local-cpu-rerun    # optional: the default study re-run, compared with the published one
    .venv/bin/python benchmarks/tools_study.py --smoke DIR       # measure and publish, tiny, into DIR

`--smoke DIR` (make test runs it): one repetition at one level (2 requests, 16 tokens in, 4 out) and then
the publishing step with its compare pages (the re-run: the published reports/local-cpu-tools/rerun),
all under DIR. What it leaves out: the engine (the reference server serves instead; the engine's params
are still built) and the peer tools, whose venvs come from scripts/setup-tools.sh, not `make setup`: their
command lines are built and written to each tool.log, and the result files they wrote for the published
study (tests/fixtures/imports) stand in for their output, so the import and the pages go through all four.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lib"))

from servelab.analysis.peers import vllm_bench_command  # noqa: E402
from servelab.hosts.base import Server  # noqa: E402
from servelab.hosts.process import Engine  # noqa: E402
from servelab.measure.runinfo import base_record  # noqa: E402
from servelab.measure.runner import run_workload  # noqa: E402
from servelab.measure.runfiles import finalize  # noqa: E402
from servelab.measure.selfcheck import RefProcess  # noqa: E402
from servelab.models import make_model  # noqa: E402
from servelab.results.importer import import_files  # noqa: E402
from servelab.results.pages import IMPORTS, TIMES, tools_page  # noqa: E402
from servelab.paths import portable_tree  # noqa: E402
from servelab.runfolder import JsonlWriter, RunFolder, load_records, read_json, read_jsonl  # noqa: E402
from servelab.schema import Bucket, EngineParams, ModelRef, Workload  # noqa: E402

TOOLS = ("servelab", "aiperf", "guidellm", "vllm-bench")
TOOL_BIN = ROOT / ".cache" / "tools"
# the default study's eager engine (params/local-cpu.yaml), prefix caching off: the tools' prompts differ
ENGINE_ARGS = {"enforce-eager": True, "dtype": "bfloat16", "max-model-len": 2048, "max-num-seqs": 8,
               "kv-cache-memory-bytes": "256M", "no-enable-prefix-caching": True}
VLLM_VERSION = "0.32.0+cpu"
PEER_FILES = {"aiperf": "profile_export.jsonl", "guidellm": "benchmarks.json", "vllm-bench": "vllm-bench.json"}
# --smoke: the peer tools' result files of the published study (tests/fixtures/imports/README.md) stand in
# for their runs; the smallest measurement and the published re-run for the compare page
STANDINS = ROOT / "tests" / "fixtures" / "imports"
SMOKE = {"on": False}
SMOKE_STANDINS = {"aiperf": STANDINS / "aiperf-c1", "guidellm": STANDINS / "guidellm-c1.json",
                  "vllm-bench": STANDINS / "vllm-bench-c4.json"}
SMOKE_SETTINGS = {"preset": "cpu-tiny", "rep": 0, "concurrency": "1", "requests": "2", "input": 16, "output": 4,
                  "tools": ",".join(TOOLS), "rerun": str(ROOT / "reports" / "local-cpu-tools" / "rerun")}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run(tool: str, cmd: list[str], out: Path, env: dict[str, str]) -> float:
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with open(out / "tool.log", "w") as f:
        f.write("# " + " ".join(cmd) + "\n")
        f.flush()
        if SMOKE["on"]:  # the tool's published result files stand in for its run
            src = SMOKE_STANDINS[tool]
            if src.is_dir():
                shutil.copytree(src, out, dirs_exist_ok=True)
            else:
                shutil.copy(src, out / PEER_FILES[tool])
            return time.monotonic() - t0
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=out, timeout=600).returncode
    if rc:
        raise RuntimeError(f"{cmd[0]} exited {rc}: see {out / 'tool.log'}")
    return time.monotonic() - t0


def aiperf(url: str, model: str, tok: str, c: int, n: int, isl: int, osl: int, out: Path) -> float:
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env["HF_HUB_DISABLE_TELEMETRY"] = "1"
    cmd = [str(TOOL_BIN / "aiperf/bin/aiperf"), "profile", "--model", model, "--url", url,
           "--endpoint-type", "chat", "--streaming", "--tokenizer", tok, "--concurrency", str(c),
           "--request-count", str(n), "--prompt-input-tokens-mean", str(isl), "--prompt-input-tokens-stddev",
           "0", "--prompt-output-tokens-mean", str(osl), "--prompt-output-tokens-stddev", "0",
           "--extra-inputs", "ignore_eos:true", "--use-server-token-count", "--random-seed", "42",
           "--output-artifact-dir", str(out), "--no-auto-plot", "--workers-max", "1",
           "--record-processor-service-count", "1", "--no-server-metrics", "--no-gpu-telemetry",
           "--ui-type", "none"]
    return run("aiperf", cmd, out, env)


def guidellm(url: str, model: str, tok: str, c: int, n: int, isl: int, osl: int, out: Path) -> float:
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1")
    cmd = [str(TOOL_BIN / "guidellm/bin/guidellm"), "run",
           "--backend", f"kind=openai_http,target={url},model={model}",
           "--profile", f"kind=concurrent,streams={c}", "--constraint", f"kind=max_requests,count={n}",
           "--tokenizer", f"kind=huggingface_auto,model={tok}",
           "--data", f"kind=synthetic_text,prompt_tokens={isl},output_tokens={osl}",
           "--output", f"kind=json,path={out / 'benchmarks.json'}", "--disable-progress"]
    return run("guidellm", cmd, out, env)


def vllm_bench(url: str, model: str, tok: str, c: int, n: int, isl: int, osl: int, out: Path, shim: Path) -> float:
    cmd = vllm_bench_command(url, model, tok, isl, osl, c, n, out / "vllm-bench.json", python=sys.executable)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(shim), str(ROOT / "lib")]), HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", VLLM_NO_USAGE_STATS="1")
    return run("vllm-bench", cmd, out, env)


def _tree_cpu(p: psutil.Process) -> float:
    """CPU seconds of a process and its children (the engine: API server and engine core)."""
    total = 0.0
    for q in [p, *p.children(recursive=True)]:
        try:
            t = q.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def _machine_cpu() -> float:
    """CPU seconds the whole machine spent busy so far (every process)."""
    t = psutil.cpu_times()
    return t.user + t.system + t.nice + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0)


def servelab(server: Server, c: int, n: int, isl: int, osl: int, out: Path) -> float:
    t0 = time.monotonic()
    wl = Workload(api="chat", buckets=[Bucket(input_tokens=isl, output_tokens=osl, ignore_eos=True)],
                  concurrency=[c], warmup_rounds=0, rounds=1, requests_per_round=n // c, timeout_s=600)
    res = run_workload(server, wl, out, study="local-cpu-tools", config_id="servelab",
                       record=base_record("local-cpu-tools", "servelab"), progress=False, log=lambda m: None)
    if res.status != "complete":
        raise RuntimeError(f"servelab: {res.status} {res.message}")
    return time.monotonic() - t0


def merge_servelab(raw: Path, dest: Path) -> None:
    """The servelab runs of every repetition and level (one folder each) as one run folder: the
    repetition is the round, levels numbered by concurrency; run.json from the first, closed again."""
    dirs = sorted(raw.glob("r*-c*"), key=lambda d: (int(d.name.split("-c")[1]), int(d.name[1:].split("-")[0])))
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    concs = sorted({int(d.name.split("-c")[1]) for d in dirs})
    seq = 0
    with JsonlWriter(dest / "records.jsonl") as w, JsonlWriter(dest / "levels.jsonl") as lw:
        for d in dirs:
            rep, c = int(d.name[1:].split("-")[0]), int(d.name.split("-c")[1])
            for r in read_jsonl(d / "records.jsonl"):
                w.write({**r, "round": rep, "level": concs.index(c), "seq": seq, "config": "servelab"})
                seq += 1
        for c in concs:
            rows = [x for d in dirs if int(d.name.split("-c")[1]) == c for x in read_jsonl(d / "levels.jsonl")]
            lw.write({**rows[0], "level": concs.index(c), "sent": sum(x["sent"] for x in rows),
                      "failed": sum(x["failed"] for x in rows), "rounds": len(rows)})
    run = read_json(dirs[0] / "run.json")
    run.update(merged_from=[d.name for d in dirs], config="servelab")
    finalize(RunFolder(dest), run, status="complete", message="")


def publish(out: Path, study: Path) -> None:
    imports = study / IMPORTS
    imports.mkdir(parents=True, exist_ok=True)
    merge_servelab(out / "raw" / "servelab", imports / "servelab")
    bucket = str(load_records(imports / "servelab")["bucket"].iloc[0])
    for tool, name in PEER_FILES.items():
        files = sorted((out / "raw" / tool).glob(f"r*-c*/{name}"),
                       key=lambda p: (int(p.parent.name.split("-c")[1]), p.parent.name))
        if files:
            res = import_files(files, tool=tool, out=imports / tool, study=study.name, config=tool, bucket=bucket,
                               force=True)
            log(res.line())
    engine = json.loads((out / "engine-r0.json").read_text())
    served_by = RunFolder(imports / "servelab").run.get("packages") or {}  # the venv that served every tool
    for tool in ("servelab", *PEER_FILES):
        rf = RunFolder(imports / tool)
        if rf.exists("run.json"):
            run = rf.run
            run["packages"] = {**served_by, **(run.get("packages") or {})}
            run.setdefault("engine_params", engine["engine_params"])
            run["server"] = {**engine, **(run.get("server") or {}), "mode": run.get("server", {}).get("mode", "launched")}
            rf.write_run({k: v for k, v in run.items() if k != "format_version"})
    times = [t for f in sorted(out.glob("times-r*.json")) for t in json.loads(f.read_text())]
    (study / TIMES).write_text(json.dumps(times, indent=1) + "\n")
    portable_tree(imports)  # no path of this machine in a published file (the source copies' sha256 is of the original)
    log(f"page {tools_page(study)}")


RERUN_FILES = ("records.jsonl", "run.json", "levels.jsonl", "quality.json")


def publish_compares(study: Path, rerun: Path | None) -> None:
    """The study's compare pages: AIPerf against servelab on this server; and, given a re-run of the
    default study (`servelab run` of params/local-cpu.yaml's eager and ngram under another study id,
    design.budget_s 240), the published default study against it, configuration by configuration."""
    from servelab.results.compare import compare
    from servelab.results.pages import compare_page

    imports = study / IMPORTS
    res = compare(imports / "servelab", imports / "aiperf")
    log(f"page {compare_page(res, study / 'compare-aiperf.html', 'AIPerf against servelab on one vLLM CPU server')}")
    if rerun is None:
        return
    dest = study / "rerun"
    shutil.rmtree(dest, ignore_errors=True)
    for cfg in sorted(p for p in rerun.iterdir() if (p / "records.jsonl").exists()):
        (dest / cfg.name).mkdir(parents=True)
        for f in RERUN_FILES:
            if (cfg / f).exists():
                shutil.copy(cfg / f, dest / cfg.name / f)
    portable_tree(dest)
    res = compare(ROOT / "reports" / "local-cpu", dest)
    log(f"page {compare_page(res, study / 'compare-rerun.html', 'The default study against its re-run on another day')}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="runs/tools-raw")
    ap.add_argument("--preset", default="smollm2-135m")
    ap.add_argument("--rep", type=int, default=0, help="which repetition this call measures (its own engine start)")
    ap.add_argument("--concurrency", default="1,4")
    ap.add_argument("--requests", default="6,12", help="requests per level (one per concurrency)")
    ap.add_argument("--input", type=int, default=128)
    ap.add_argument("--output", type=int, default=64)
    ap.add_argument("--tools", default=",".join(TOOLS))
    ap.add_argument("--port", type=int, default=8031)
    ap.add_argument("--publish", help="import the raw files of --out into this study folder and render its page")
    ap.add_argument("--rerun", help="with --publish: a re-run of the default study (runs/<id>) to compare with it")
    ap.add_argument("--smoke", type=Path, metavar="DIR",
                    help="one tiny repetition against the reference server, then --publish, all under DIR")
    a = ap.parse_args()
    if a.smoke:  # measure, then publish
        SMOKE["on"] = True
        vars(a).update(SMOKE_SETTINGS, out=str(a.smoke / "tools-raw"))
        measure(a, a.smoke / "tools-raw")
        a.publish = str(a.smoke / "local-cpu-tools")
    out = Path(a.out).resolve()
    if a.publish:
        publish(out, Path(a.publish))
        publish_compares(Path(a.publish), Path(a.rerun) if a.rerun else None)
        return 0
    measure(a, out)
    return 0


@contextlib.contextmanager
def serving(params: EngineParams, model_dir: str, out: Path, rep: int) -> Iterator[tuple[str, Any, int, dict]]:
    """The engine of `params`, started (with --smoke the reference server instead): its URL, its
    servelab Server, the pid whose process tree is the engine's CPU, and what to record of it."""
    if SMOKE["on"]:
        with RefProcess(ttft_s=0.005, itl_s=0.002) as ref:
            assert ref.proc is not None
            yield ref.url, Server(base_url=ref.url, model="ref"), ref.proc.pid, {"smoke": "reference server",
                                                                               "base_url": ref.url}
        return
    eng = Engine(params, model_dir, out / f"engine-r{rep}").start()
    try:
        log(f"engine up in {eng.startup_s:.0f} s")
        yield eng.base_url, eng.server(), eng.proc.pid, eng.record()
    finally:
        eng.stop()
        shutil.copy(eng.log_path, out / f"engine-r{rep}.log")


def measure(a: argparse.Namespace, out: Path) -> None:
    """One repetition: an engine start, every tool at every level in turn, the engine stopped."""
    (out / "raw").mkdir(parents=True, exist_ok=True)
    for old in (out / "raw").glob(f"*/r{a.rep}-c*"):  # this repetition measured again
        shutil.rmtree(old)
    tools = a.tools.split(",")
    levels = list(zip((int(x) for x in a.concurrency.split(",")), (int(x) for x in a.requests.split(","))))
    model_dir = str(make_model(a.preset))
    shim = out / "shim" / f"vllm-{VLLM_VERSION}.dist-info"  # vllm bench reads the distribution named vllm
    shim.mkdir(parents=True, exist_ok=True)
    (shim / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {VLLM_VERSION}\n")
    params = EngineParams(kind="vllm", model=ModelRef(path=model_dir), port=a.port, args=ENGINE_ARGS,
                          startup_timeout_s=400, load_format=None)
    rep = a.rep
    times: list[dict] = []
    with serving(params, model_dir, out, rep) as (url, server, pid, record):
        try:
            engine_ps = psutil.Process(pid)
            model = json.loads(subprocess.run(["curl", "-s", url + "/v1/models"], capture_output=True,
                                              text=True).stdout)["data"][0]["id"]
            log(f"{url} serving {model}")
            (out / f"engine-r{rep}.json").write_text(json.dumps({**record, "engine_params": params.model_dump(mode="json"),
                                                                "model": model}, indent=2, default=str))
            order = tools[rep % len(tools):] + tools[:rep % len(tools)]  # rotate who goes first
            for tool in order:
                for c, n in levels:
                    d = out / "raw" / tool / f"r{rep}-c{c}"
                    m0 = _machine_cpu()
                    e0, c0, p0 = _tree_cpu(engine_ps), resource.getrusage(resource.RUSAGE_CHILDREN), time.process_time()
                    if tool == "servelab":
                        s = servelab(server, c, n, a.input, a.output, d)
                    elif tool == "aiperf":
                        s = aiperf(url, model, model_dir, c, n, a.input, a.output, d)
                    elif tool == "guidellm":
                        s = guidellm(url, model, model_dir, c, n, a.input, a.output, d)
                    else:
                        s = vllm_bench(url, model, model_dir, c, n, a.input, a.output, d, shim.parent)
                    c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
                    client = (c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime) if tool != "servelab" \
                        else time.process_time() - p0
                    engine_cpu = _tree_cpu(engine_ps) - e0
                    others = _machine_cpu() - m0 - engine_cpu - client  # processes of no tool here: the machine is shared
                    times.append({"rep": rep, "tool": tool, "concurrency": c, "requests": n, "wall_s": s,
                                  "client_cpu_s": client, "engine_cpu_s": engine_cpu, "others_cpu_s": max(others, 0.0)})
                    log(f"rep {rep} {tool} c={c}: {n} requests in {s:.1f} s, client CPU {client:.1f} s, "
                        f"engine {engine_cpu:.1f} s, other processes {others:.1f} s")
        finally:
            (out / f"times-r{rep}.json").write_text(json.dumps(times, indent=2))


if __name__ == "__main__":
    sys.exit(main())
