"""Reliability: a fault matrix against the reference server, SIGKILL + --resume, Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from servelab.schema import Bucket, Workload
from servelab.hosts.base import Server
from servelab.runfolder import read_json, read_jsonl
from servelab.measure.runinfo import base_record
from servelab.measure.runner import run_workload
from paths import ROOT


EXPECTED = {"http_429": "http_status", "http_500": "http_status", "http_503": "http_status",
            "reset": "disconnect", "stall": "timeout", "malformed": "malformed_stream",
            "empty_choices": "no_tokens", "no_done": "malformed_stream"}  # no_usage: counted on the client


@pytest.mark.parametrize("fault", sorted(EXPECTED))
def test_fault_matrix_accounts_for_every_request(refserver, tmp_path, fault):
    """Every third request faults: sent = succeeded + failed by reason, no successful record lost."""
    s = refserver(ttft_s=0.005, itl_s=0.002, fault=fault, fault_every=3)
    wl = Workload(buckets=[Bucket(input_tokens=20, output_tokens=10)], concurrency=[3], warmup_rounds=0, rounds=3,
                  requests_per_round=2, timeout_s=1.0)
    res = run_workload(Server(s.url, "ref"), wl, tmp_path / "r", study="t", config_id="r",
                       record=base_record("t", "r"), progress=False, metrics_interval_s=0)
    recs = read_jsonl(tmp_path / "r" / "records.jsonl")
    ok = [r for r in recs if r["ok"]]
    bad = [r for r in recs if not r["ok"]]
    assert res.status == "complete" and len(recs) == 18
    assert sorted(r["seq"] for r in recs) == list(range(18))
    assert len(bad) == s.stats.faults[fault] == 6  # (tokenize probes are not completions)
    assert {r["error_kind"] for r in bad} == {EXPECTED[fault]}
    assert all(r["output_tokens"] == 10 and r["ttft_s"] > 0 for r in ok) and len(ok) == 12
    row = res.summary.iloc[0]
    assert row["sent"] == 18 and row["ok"] == 12 and row["failures"] == f"{EXPECTED[fault]}=6"
    print(f"{fault}: sent 18, ok 12, {EXPECTED[fault]} 6")


@pytest.mark.parametrize("usage_off,fault_every", [(True, 0), (False, 3)])
def test_stream_without_usage_is_counted_with_the_tokenizer_not_failed(refserver, tmp_path, usage_off, fault_every):
    """A server that never streams usage (or drops it every third request): those records are
    ok, their output tokens counted with the server's /tokenize, marked client-counted."""
    s = refserver(ttft_s=0.005, itl_s=0.002, usage=not usage_off, fault="no_usage" if fault_every else None,
                  fault_every=fault_every)
    wl = Workload(buckets=[Bucket(input_tokens=20, output_tokens=10)], concurrency=[3], warmup_rounds=0, rounds=3,
                  requests_per_round=2, timeout_s=5.0)
    res = run_workload(Server(s.url, "ref"), wl, tmp_path / "r", study="t", config_id="r",
                       record=base_record("t", "r"), progress=False, metrics_interval_s=0)
    recs = read_jsonl(tmp_path / "r" / "records.jsonl")
    assert res.status == "complete" and len(recs) == 18 and all(r["ok"] for r in recs)
    client = [r for r in recs if r["output_tokens_source"] == "client"]
    assert len(client) == (18 if usage_off else s.stats.faults["no_usage"]) and (usage_off or len(client) == 6)
    assert {r["output_tokens_source"] for r in recs} == ({"client"} if usage_off else {"client", "server"})
    assert all(r["output_tokens"] == 10 for r in recs)
    # a rate wherever the stream took time after its first token (a loaded client may read every chunk at once: none)
    assert all(r["decode_tps"] > 0 if r["e2e_s"] > r["ttft_s"] else r["decode_tps"] is None for r in recs)
    assert all("output_text" not in r for r in recs)  # the text is counted, never written
    assert res.summary.iloc[0]["ok"] == 18 and res.summary.iloc[0]["failures"] == ""


def _study(tmp_path: Path, url: str, rounds: int) -> Path:
    d = {"study": "resume-test", "title": "resume", "host": {"kind": "attach", "attach": {"url": url}},
         "workload": {"buckets": [{"input_tokens": 20, "output_tokens": 30}, {"input_tokens": 40, "output_tokens": 30}],
                      "concurrency": [1, 2], "warmup_rounds": 0, "rounds": rounds, "timeout_s": 10},
         "configurations": [{"id": "only"}]}
    p = tmp_path / "resume-test.yaml"
    p.write_text(yaml.safe_dump(d))
    return p


def _cli(args, env, **kw):
    return subprocess.Popen([sys.executable, "-m", "servelab.cli", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def test_sigkill_mid_level_then_resume_is_complete_and_duplicate_free(refserver, tmp_path):
    s = refserver(ttft_s=0.01, itl_s=0.01)  # ~0.3 s per request
    params = _study(tmp_path, s.url, rounds=4)
    env = {**os.environ, "SERVELAB_RUNS": str(tmp_path / "runs"), "SERVELAB_REPORTS": str(tmp_path / "reports")}
    rdir = tmp_path / "runs" / "resume-test" / "only"
    p = _cli(["run", str(params), "--no-notebooks", "--no-report"], env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # kill in the middle of the third level (in40 c=1)
        if len(read_jsonl(rdir / "levels.jsonl")) >= 2 and len(read_jsonl(rdir / "records.jsonl")) >= 4 + 8 + 2:
            break
        time.sleep(0.05)
    p.send_signal(signal.SIGKILL)
    p.wait(10)
    before = read_jsonl(rdir / "records.jsonl")
    done = read_jsonl(rdir / "levels.jsonl")
    assert len(done) == 2 and read_json(rdir / "run.json")["status"] == "running"
    kept = [r for r in before if r["level"] in {d["level"] for d in done}]
    r = _cli(["run", str(params), "--no-notebooks", "--no-report", "--resume"], env)
    out, err = r.communicate(timeout=120)
    assert r.returncode == 0, err
    after = read_jsonl(rdir / "records.jsonl")
    # levels: 4 rounds x (1 + 2 + 1 + 2) = 24 requests in all, each level exactly once
    assert len(after) == 24
    per_level = {lv: sum(1 for x in after if x["level"] == lv) for lv in range(4)}
    assert per_level == {0: 4, 1: 8, 2: 4, 3: 8}
    assert len({x["seq"] for x in after}) == 24
    assert [x for x in after if x["level"] in (0, 1)] == kept  # completed levels untouched
    run = read_json(rdir / "run.json")
    assert run["status"] == "complete" and run["resumed"][0]["skipped_levels"] == [0, 1]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_stop_signal_ends_the_run_like_ctrl_c(refserver, tmp_path, sig):
    """Ctrl-C, and what CI, `timeout`, systemd or a container runtime send: records kept, run.json
    partial with the reason, the summary in run.json, a non-zero exit."""
    s = refserver(ttft_s=0.01, itl_s=0.02)
    params = _study(tmp_path, s.url, rounds=20)
    env = {**os.environ, "SERVELAB_RUNS": str(tmp_path / "runs"), "SERVELAB_REPORTS": str(tmp_path / "reports")}
    rdir = tmp_path / "runs" / "resume-test" / "only"
    p = _cli(["run", str(params), "--no-notebooks", "--no-report"], env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(read_jsonl(rdir / "records.jsonl")) < 3:
        time.sleep(0.05)
    p.send_signal(sig)
    out, err = p.communicate(timeout=60)
    run = read_json(rdir / "run.json")
    reason = "the user (Ctrl-C)" if sig == signal.SIGINT else sig.name
    assert run["status"] == "partial" and f"interrupted by {reason}" in run["message"], run["message"]
    recs = read_jsonl(rdir / "records.jsonl")
    assert run["records"] == len(recs) >= 3
    assert len({r["seq"] for r in recs}) == len(recs)  # nothing written twice
    assert run["headline"]["sent"] == sum(1 for r in recs if not r["warmup"])
    assert p.returncode != 0


@pytest.mark.parametrize("lang", ["en", "ja"])
def test_report_says_which_output_tokens_servelab_counted(lang):
    import types

    import pandas as pd

    from servelab.report.i18n import words
    from servelab.report.sections import method_text

    wl = Workload(buckets=[Bucket(input_tokens=20, output_tokens=10)], concurrency=[1])
    runs = {"a": {"calibration": {"in20-out10": {"target_tokens": 20, "tokens": 20, "counter": "server /tokenize"}}}}
    recs = pd.DataFrame({"output_tokens_source": ["client"] * 3 + ["server"] * 5})
    sd = types.SimpleNamespace(study=types.SimpleNamespace(workload=wl), runs=runs, w=words(lang), records=recs)
    text = method_text(sd)
    assert text.endswith(words(lang)("tokens.client_counted", n="3", total="8", counter="server /tokenize"))
    sd.records = recs.assign(output_tokens_source="server")
    assert "output_tokens_source" not in method_text(sd)
