"""`servelab run` on a GPU machine, end to end without a GPU: stand-in GPUs (SERVELAB_GPUS) and a stand-in
engine, a Python (`engine.python`) that serves servelab's reference server on the port the runner gives it and
answers `vllm bench serve` with a result file. The runner starts one server per engine with its port and
CUDA_VISIBLE_DEVICES, measures every configuration on it through the ordinary stages, records the server's own
answers, runs the peer tool, stops every server, refuses a machine too small before anything starts, and
continues with --resume after --stop-after."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
import yaml

from conftest import free_ports
from paths import ROOT
from servelab import pipeline
from servelab.cli import main
from servelab.runfolder import RunFolder
from servelab.schema import load_study

FAKE = textwrap.dedent(f"""\
    #!{sys.executable}
    import json, os, sys
    from pathlib import Path
    args = sys.argv[1:]
    if args[:1] == ["-c"]:  # the host probe (measure.hostprobe): one eager launch of 7 us
        print(json.dumps({{"launch_eager_s": 7e-6, "torch": "stand-in"}}))
        sys.exit(0)
    if "bench" in args:  # vllm bench serve: a result file where it is asked for
        d, f = args[args.index("--result-dir") + 1], args[args.index("--result-filename") + 1]
        Path(d, f).write_text(json.dumps({{"completed": 1, "failed": 0}}))
        sys.exit(0)
    print("CUDA_VISIBLE_DEVICES=" + os.environ.get("CUDA_VISIBLE_DEVICES", "(unset)"), flush=True)
    from servelab.measure.refserver import main
    main(["--port", args[args.index("--port") + 1], "--ttft", "0.01", "--itl", "0.002"])
    """)


@pytest.fixture
def gpu_study(tmp_path, monkeypatch, cpu_model_dir):
    """A three-configuration study (a and b share one engine) on one stand-in H100, runs under tmp_path."""
    fake = tmp_path / "enginepy"
    fake.write_text(FAKE)
    fake.chmod(0o755)
    port = free_ports(3)  # the runner gives servers port, port+1, ...; the stop test adds a third
    data = {"study": "gpu-runner", "title": "t",
            "engine": {"kind": "vllm", "model": {"path": str(cpu_model_dir)}, "port": port, "python": str(fake),
                       "startup_timeout_s": 60, "args": {"gpu-memory-utilization": 0.3}},
            "workload": {"api": "completions", "buckets": [{"input_tokens": 16, "output_tokens": 8}],
                         "concurrency": [1], "warmup_rounds": 0, "rounds": 1},
            "quality": {"enabled": False},
            "placement": {"gpus": 1},
            "peers": {"a": [{"tool": "vllm-bench", "input_tokens": 16, "output_tokens": 8, "concurrency": 1}]},
            "configurations": [{"id": "a"}, {"id": "b", "workload": {"concurrency": [2]}},
                               {"id": "c", "engine": {"args": {"max-num-seqs": 8}}}]}
    params = tmp_path / "gpu-runner.yaml"
    params.write_text(yaml.safe_dump(data))
    monkeypatch.setenv("SERVELAB_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv("SERVELAB_REPORTS", str(tmp_path / "reports"))
    monkeypatch.setenv("SERVELAB_GPUS", "1xH100")
    monkeypatch.setenv("SERVELAB_VLLM_PYTHON", str(fake))  # the peer tool's Python: the vLLM environment's
    return params, port


def _run(capfd, params: Path, *extra: str) -> subprocess.CompletedProcess:
    """`servelab run PARAMS --no-notebooks --no-report EXTRA` in this process (the command line's own entry point),
    with its exit status and what it printed."""
    capfd.readouterr()
    rc = main(["run", str(params), "--no-notebooks", "--no-report", *extra])
    out, err = capfd.readouterr()
    return subprocess.CompletedProcess([], rc, out, err)


def test_each_engine_is_served_once_on_its_gpu_and_every_configuration_measured(gpu_study, tmp_path, capfd):
    params, port = gpu_study
    r = _run(capfd, params)
    assert r.returncode == 0, r.stderr[-3000:]
    root = tmp_path / "runs" / "gpu-runner"
    handles = {c: json.loads((root / ".served" / f"{c}.json").read_text()) for c in "abc"}
    assert handles["a"]["pid"] == handles["b"]["pid"] != handles["c"]["pid"]  # a and b: one engine, one server
    assert {h["base_url"] for h in handles.values()} == {f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port + 1}"}
    for c in "abc":
        rf = RunFolder(root / c)
        assert rf.run["status"] == "complete" and len(rf.records) >= 1
        assert rf.run["engine_params"]["env"]["CUDA_VISIBLE_DEVICES"] == "0"
        assert (root / c / "recorded" / "models.json").exists() and (root / c / "recorded" / "metrics-after.txt").exists()
    log = (root / ".servers" / "a" / "engine.log").read_text()
    assert "CUDA_VISIBLE_DEVICES=0" in log and str(Path(params).parent / "enginepy") in log
    assert (root / "peer" / "a" / "vllm-bench-in16-out8-c1.json").exists()
    design = json.loads((root / "design.json").read_text())
    assert sorted(design["placement"]["servers"]) == ["a", "c"] and set(design["placement"]["startup_s"]) == {"a", "c"}
    assert design["placement"]["servers"]["a"]["configs"] == ["a", "b"]
    for h in handles.values():  # every server stopped
        assert not psutil.pid_exists(h["pid"]) or psutil.Process(h["pid"]).status() == psutil.STATUS_ZOMBIE
    assert "placement:   server a on GPU 0" in r.stderr
    # the host's CPU probed once before the first server, with the engine's Python, in every run record (the
    # prediction of a run on a real GPU scales the engine's CPU-side terms by it: tests/analysis/test_hosts.py)
    assert json.loads((root / "host_probe.json").read_text())["launch_eager_s"] == 7e-6
    for c in "abc":
        assert RunFolder(root / c).run["host_probe"]["launch_eager_s"] == 7e-6


def test_stop_after_leaves_the_rest_to_resume(gpu_study, tmp_path, capfd, monkeypatch):
    """... and a study measured on a GPU host is published from a machine without one: --resume with every
    configuration complete starts nothing."""
    from servelab import pipeline
    params, _ = gpu_study
    r = _run(capfd, params, "--stop-after", "0.01")
    assert r.returncode == 1 and "continue with --resume" in r.stderr
    root = tmp_path / "runs" / "gpu-runner"
    assert not any((root / c / "run.json").exists() for c in "abc")
    r = _run(capfd, params, "--resume", "--config", "a,b")
    assert r.returncode == 0, r.stderr[-3000:]
    assert [RunFolder(root / c).run.get("status") for c in "abc"] == ["complete", "complete", None]
    r = _run(capfd, params, "--resume")
    assert r.returncode == 0 and "configuration a: complete, skipped (--resume)" in r.stderr
    assert RunFolder(root / "c").run["status"] == "complete"
    monkeypatch.setenv("SERVELAB_GPUS", "[]")  # the laptop the runs were copied to
    rendered = []
    monkeypatch.setattr(pipeline, "render", lambda study_id, **kw: rendered.append((study_id, kw["pub"])))
    capfd.readouterr()
    assert main(["run", str(params), "--resume"]) == 0, capfd.readouterr().err[-3000:]
    assert "nothing to start, publishing" in capfd.readouterr().err
    pub = tmp_path / "reports" / "gpu-runner"
    assert rendered == [("gpu-runner", pub)] and all((pub / "data" / c / "records.jsonl").exists() for c in "abc")


def test_a_deadline_passed_while_a_server_starts_still_measures_it_and_publishes_what_was_measured(
        gpu_study, tmp_path, capfd, monkeypatch):
    """--stop-after stops new servers only: the server that became healthy past the deadline measures both of its
    configurations (its start is paid for), the next server is left to --resume, and the page is published from
    what was measured (exit status 3); --resume measures the rest and publishes over that page."""
    from servelab import lanes
    params, _ = gpu_study
    data = yaml.safe_load(params.read_text())
    data["configurations"][2]["engine"]["args"]["gpu-memory-utilization"] = 0.9  # c: a server of its own, after a's
    params.write_text(yaml.safe_dump(data))
    start = lanes.Runner._start  # noqa: SLF001 - the deadline passes inside it, as on a real machine

    def start_past_the_deadline(self, s):
        ok = start(self, s)
        self.deadline = time.monotonic() - 1  # the deadline passed while this server started
        return ok

    monkeypatch.setattr(lanes.Runner, "_start", start_past_the_deadline)
    published = []
    monkeypatch.setattr(pipeline, "publish", lambda study, root, force=False: published.append((study, force)))
    capfd.readouterr()
    rc = main(["run", str(params), "--no-notebooks", "--stop-after", "3600"])
    err = capfd.readouterr().err
    root = tmp_path / "runs" / "gpu-runner"
    assert rc == 3, err[-3000:]
    assert [RunFolder(root / c).run.get("status") for c in "abc"] == ["complete", "complete", None]
    assert "not started before --stop-after: c" in err and "failed:" not in err
    assert "published 2 of 3 configurations; not measured: c" in err and published == [("gpu-runner", False)]
    monkeypatch.setattr(lanes.Runner, "_start", start)
    assert main(["run", str(params), "--no-notebooks", "--resume"]) == 0, capfd.readouterr().err[-3000:]
    assert RunFolder(root / "c").run["status"] == "complete" and published[-1] == ("gpu-runner", True)


def test_resume_without_runs_here_does_not_replace_a_page_published_elsewhere(gpu_study, tmp_path, capfd):
    params, _ = gpu_study
    page = tmp_path / "reports" / "gpu-runner" / "index.html"
    page.parent.mkdir(parents=True)
    page.write_text("published elsewhere")
    capfd.readouterr()
    rc = main(["run", str(params), "--no-notebooks", "--resume"])
    assert rc != 0 and "is published: pass --force" in capfd.readouterr().err
    assert page.read_text() == "published elsewhere" and not (tmp_path / "runs" / "gpu-runner").exists()


def test_a_machine_too_small_is_refused_before_anything_starts(gpu_study, tmp_path, capfd, monkeypatch):
    params, _ = gpu_study
    data = yaml.safe_load(params.read_text())
    data["configurations"].append({"id": "tp2", "engine": {"args": {"tensor-parallel-size": 2}}})
    data["placement"] = {}
    params.write_text(yaml.safe_dump(data))
    r = _run(capfd, params)
    assert r.returncode == 2 and "tp2: layout TP=2 takes 2 GPUs" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "runs" / "gpu-runner").exists()
    monkeypatch.setenv("SERVELAB_GPUS", "2xH200")
    r = _run(capfd, params, "--dry-run")
    assert r.returncode == 0 and "server tp2 on GPU 0,1" in r.stdout


def test_the_dry_run_places_a_gpu_study_on_this_machine_or_the_one_named():
    out = pipeline.describe(load_study(ROOT / "params" / "h200-arch-holdout.yaml"))
    assert "placement: 1 GPU as the study plans them" in out
    assert "server qwen15moe on GPU 0" in out and "qwen15moe, qwen15moe-ttft" in out


def test_a_stop_signal_stops_every_server_and_keeps_what_was_measured(gpu_study, tmp_path):
    params, port = gpu_study
    data = yaml.safe_load(params.read_text())
    data["workload"].update(rounds=40, buckets=[{"input_tokens": 16, "output_tokens": 64}])  # long enough to stop
    params.write_text(yaml.safe_dump(data))
    proc = subprocess.Popen([sys.executable, "-m", "servelab.cli", "run", str(params), "--no-notebooks", "--no-report"],
                            cwd=ROOT, env=dict(os.environ), stderr=subprocess.PIPE, text=True)
    root = tmp_path / "runs" / "gpu-runner"
    records = root / "a" / "records.jsonl"
    deadline = time.monotonic() + 120
    while not (records.exists() and records.read_text().count("\n") >= 3) and time.monotonic() < deadline:
        time.sleep(0.2)  # the first configuration's first requests measured
    proc.send_signal(signal.SIGTERM)
    rest = proc.communicate(timeout=120)[1]
    assert proc.returncode != 0, rest
    handles = [json.loads(p.read_text()) for p in (root / ".served").glob("*.json")]
    assert handles and all(not psutil.pid_exists(h["pid"]) or psutil.Process(h["pid"]).status() == psutil.STATUS_ZOMBIE
                           for h in handles)
    run = RunFolder(root / "a").run
    assert run.get("status") == "partial", rest
    assert run["status"] == "partial" and "SIGTERM" in run["message"] and len(RunFolder(root / "a").records) > 0


def test_a_run_the_stop_ended_failed_or_partial_is_closed_with_the_stop_as_its_reason(tmp_path):
    """The stop signal stops the servers first; a lane's run then ends on refused requests, partial or failed,
    and sometimes after the main thread's closing write (a slow lane): whichever writes last, the run is partial,
    says the stop, and keeps its records for --resume. A run the stop did not touch keeps its status."""
    from servelab.execute import close_partial
    from servelab.runfolder import RunFolder

    published = ROOT / "reports" / "local-cpu-kv" / "data" / "roomy" / "records.jsonl"
    line = next(ln for ln in published.read_text().splitlines() if not json.loads(ln)["warmup"])
    for status in ("failed", "partial", "running"):
        rdir = tmp_path / status
        rdir.mkdir()
        (rdir / "records.jsonl").write_text(line + "\n")  # one measured request, as published
        (rdir / "run.json").write_text(json.dumps({"status": status, "message": "server gone"}))
        close_partial(rdir, "SIGTERM", over_partial=status != "running")
        run = RunFolder(rdir).run
        assert run["status"] == "partial" and "stopped by SIGTERM" in run["message"] and run["records"] == 1, status
    (tmp_path / "complete").mkdir()
    (tmp_path / "complete" / "run.json").write_text(json.dumps({"status": "complete", "message": ""}))
    close_partial(tmp_path / "complete", "SIGTERM", over_partial=True)
    assert RunFolder(tmp_path / "complete").run["status"] == "complete"
