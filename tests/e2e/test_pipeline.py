"""The default study end to end at reduced size: papermill stage notebooks per configuration,
the published HTML report opened in headless Chromium, nbval on the executed notebooks,
re-rendering from data alone, and no overwrite without --force."""

from __future__ import annotations

import json
import os
import shutil
import uuid
import subprocess
import sys

import pandas as pd
import pytest
import yaml

from browser import check_in_browser
from conftest import free_port
from servelab import report
from paths import ROOT

pytestmark = [pytest.mark.engine, pytest.mark.notebooks]


def _servelab(*args, env, timeout=900):
    return subprocess.run([sys.executable, "-m", "servelab.cli", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


CANARY = "sk-canary-" + uuid.uuid4().hex


@pytest.fixture(scope="module")
def study_run(tmp_path_factory):
    """The default study, reduced, with a canary API key that the engine requires."""
    base = tmp_path_factory.mktemp("study")
    params = yaml.safe_load((ROOT / "params" / "local-cpu-kv.yaml").read_text())
    params["engine"]["api_key_env"] = "SERVELAB_CANARY_API_KEY"
    params["engine"]["port"] = free_port()  # never the study's own port: another server may hold it
    (base / "local-cpu-kv.yaml").write_text(yaml.safe_dump(params))
    env = {**os.environ, "SERVELAB_RUNS": str(base / "runs"), "SERVELAB_REPORTS": str(base / "reports"),
           "SERVELAB_CANARY_API_KEY": CANARY}
    r = _servelab("run", str(base / "local-cpu-kv.yaml"), "--reduced", env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    return base, env, r


def test_canary_secret_reaches_no_artifact(study_run):
    base, _, r = study_run
    files = [p for p in base.rglob("*") if p.is_file()]
    assert len(files) > 20
    leaks = [p for p in files if CANARY.encode() in p.read_bytes()]
    assert leaks == [] and CANARY not in r.stdout + r.stderr
    run = json.loads((base / "runs" / "local-cpu-kv" / "roomy" / "run.json").read_text())
    assert run["server"]["env"]["VLLM_API_KEY"] == "***"  # the engine did get a key
    assert run["headline"]["success_rate"] == 1.0  # and the client authenticated with it


def test_report_is_published_with_data(study_run):
    base, _, _ = study_run
    pub = base / "reports" / "local-cpu-kv"
    assert (pub / "index.html").exists() and (base / "reports" / "index.html").exists()
    for cid in ("roomy", "kv-tight"):
        for f in ("records.jsonl", "run.json", "server_metrics.jsonl"):
            assert (pub / "data" / cid / f).stat().st_size > 0
        nbs = sorted(p.name for p in (base / "runs" / "local-cpu-kv" / cid / "notebooks").glob("*.ipynb"))
        assert nbs == ["01_provision.ipynb", "02_launch.ipynb", "04_diagnose.ipynb"]
    # both engines ran side by side: one benchmark notebook measured them interleaved
    shared = base / "runs" / "local-cpu-kv" / "notebooks" / "03_benchmark.ipynb"
    assert shared.exists() and "roomy" in shared.read_text() and "kv-tight" in shared.read_text()
    design = json.loads((pub / "data" / "design.json").read_text())
    assert design["interleaved"] and design["order"] == ["roomy", "kv-tight"]
    assert [x["stopped"] for x in design["levels"]] == ["fixed"] * 4  # no budget: the workload's rounds
    html = (pub / "index.html").read_text()
    assert "kv-tight" in html and "Reproducibility record" in html and "args.num-gpu-blocks-override" in html


def test_report_opens_in_chromium_with_all_figures(study_run, tmp_path):
    base, _, _ = study_run
    res = check_in_browser(base / "reports" / "local-cpu-kv" / "index.html", screenshot=tmp_path / "shot.png")
    assert res["images"] >= 3 and res["broken_images"] == 0
    assert res["errors"] == [] and not res["traceback"]
    assert res["title"].startswith("vLLM on CPU")
    assert (tmp_path / "shot.png").stat().st_size > 10_000


def test_report_rerenders_from_data_alone(study_run):
    """The published copy holds everything the write-up reads: the same summary and per-level
    effects as the run folders. (Rendering from a published copy alone, byte for byte, is the
    README's `servelab report local-cpu-kv`: tests/e2e/test_readme.py.)"""
    base, _, _ = study_run
    published = report.load_study_data(base / "reports" / "local-cpu-kv")
    from_runs = report.load_study_data(base / "runs" / "local-cpu-kv")
    pd.testing.assert_frame_equal(published.summary, from_runs.summary)
    from servelab.report import progress

    pd.testing.assert_frame_equal(progress.effects(published), progress.effects(from_runs))
    assert len(progress.effects(published)) > 0


def test_second_run_never_overwrites_published_report(study_run):
    base, env, _ = study_run
    index = base / "reports" / "local-cpu-kv" / "index.html"
    mtime = index.stat().st_mtime_ns
    r = _servelab("run", str(base / "local-cpu-kv.yaml"), "--reduced", env=env, timeout=120)
    assert r.returncode == 2  # a user error: one line, the usage exit status
    errors = [ln for ln in r.stderr.strip().splitlines() if ": warning: " not in ln]  # preflight warnings first
    assert len(errors) == 1 and "is published: pass --force to replace it" in errors[0]
    assert index.stat().st_mtime_ns == mtime


def test_nbval_on_executed_notebooks(study_run, tmp_path):
    """Stable cells (marked NBVAL_CHECK_OUTPUT) reproduce when the notebooks run again."""
    base, env, _ = study_run
    nbs = [base / "runs" / "local-cpu-kv" / "roomy" / "notebooks" / "01_provision.ipynb",
           base / "runs" / "local-cpu-kv" / "roomy" / "notebooks" / "04_diagnose.ipynb",
           base / "runs" / "local-cpu-kv" / "05_writeup.ipynb"]
    for nb in nbs:
        shutil.copy(nb, tmp_path / nb.name)
    r = subprocess.run([sys.executable, "-m", "pytest", "--nbval-lax", "-p", "no:cacheprovider", "-q",
                        *[str(tmp_path / nb.name) for nb in nbs]], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout[-3000:]
    import re

    passed = int(re.search(r"(\d+) passed", r.stdout).group(1))
    assert passed >= 15  # every cell of the three notebooks is one nbval item


def test_kv_verdicts_tight_vs_roomy(study_run):
    """The tight KV cache shows near-full usage and waiting requests; the roomy one does not."""
    from servelab.analysis import kv_verdict
    from servelab.runfolder import load_samples

    base, _, _ = study_run
    data = base / "reports" / "local-cpu-kv" / "data"
    tight = kv_verdict(load_samples(data / "kv-tight" / "server_metrics.jsonl"))
    roomy = kv_verdict(load_samples(data / "roomy" / "server_metrics.jsonl"))
    assert tight["limited"] and tight["kv_usage_max_frac"] >= 0.9
    assert tight["waiting_max"] > 0 or tight["preemptions_delta"] > 0
    assert not roomy["limited"] and roomy["kv_usage_max_frac"] < 0.5 and roomy["preemptions_delta"] == 0
    html = (base / "reports" / "local-cpu-kv" / "index.html").read_text()
    assert "KV cache 136 blocks x 32 tokens</strong>: <strong>KV capacity limits concurrency." in html
    assert "KV cache 256 MB (~65K tokens)</strong>: <strong>KV capacity does not limit concurrency." in html
    for section in ("TTFT vs prompt length", "Saturation and goodput", "KV-cache residency", "Roofline",
                    "Speculative decoding", "One change at a time", "Observation → first check"):
        assert section in html


def test_sigterm_mid_level_stops_the_engine_and_keeps_a_partial_run(tmp_path):
    """What CI, `timeout`, systemd or a container runtime send: `servelab run` ends as on Ctrl-C.
    The signal reaches only `servelab run` (not the papermill kernel, not the engine): records
    kept, run.json partial with the reason, the summary written, the engine's process group gone."""
    import signal
    import socket
    import time

    import psutil

    params = yaml.safe_load((ROOT / "params" / "local-cpu-kv.yaml").read_text())
    port = free_port()
    params["engine"]["port"] = port
    params["configurations"] = params["configurations"][:1]
    params["reduced"] = {"warmup_rounds": 0, "rounds": 4}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(params))
    env = {**os.environ, "SERVELAB_RUNS": str(tmp_path / "runs"), "SERVELAB_REPORTS": str(tmp_path / "reports")}
    rdir = tmp_path / "runs" / "local-cpu-kv" / "roomy"
    p = subprocess.Popen([sys.executable, "-m", "servelab.cli", "run", str(tmp_path / "s.yaml"), "--reduced",
                          "--no-report"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and p.poll() is None:
        recs = rdir / "records.jsonl"
        if recs.exists() and len(recs.read_text().splitlines()) >= 2:
            break
        time.sleep(0.2)
    assert p.poll() is None, p.communicate()[1][-2000:]
    pid = json.loads((rdir / "engine.json").read_text())["pid"]
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=180)
    assert p.returncode != 0
    run = json.loads((rdir / "run.json").read_text())
    assert run["status"] == "partial" and "SIGTERM" in run["message"], run["message"]
    n = len((rdir / "records.jsonl").read_text().splitlines())
    assert run["records"] == n >= 2 and run["headline"]["sent"] >= 1
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", port)) != 0  # nothing listens on the engine's port
    assert "engine stopped" in err or "engine killed" in err, err[-2000:]


def test_prediction_is_written_before_the_first_request(study_run):
    """prediction.json (analysis.perfmodel) lands in the run folder before the first request is sent:
    its time stamp precedes every record's send time, and it says it was stored before measurement."""
    from datetime import datetime

    base, _, _ = study_run
    folders = [p for p in (base / "runs" / "local-cpu-kv").iterdir() if (p / "records.jsonl").exists()]
    assert folders
    for f in folders:
        pred = json.loads((f / "prediction.json").read_text())
        assert pred["stored_before_measurement"] is True and pred["format_version"] == 1
        stored = datetime.fromisoformat(pred["stored_at"]).timestamp()
        sent = [json.loads(line)["sent_unix_s"] for line in (f / "records.jsonl").read_text().splitlines()]
        assert sent and stored < min(sent), (f.name, pred["stored_at"], min(sent))
        assert pred.get("buckets") or pred.get("not_predictable")
        assert json.loads((f / "run.json").read_text())["prediction_file"] == "prediction.json"
