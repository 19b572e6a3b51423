"""Which tool wrote a file, and what a file that is none of them gets: one line naming the file and
the formats expected (exit 2 at the command line), and nothing written.

Fixtures (tests/fixtures/imports/README.md): files the tools wrote against this machine's vLLM CPU
server (benchmarks/tools_study.py), and SGLang's bench_serving shape from tests/fixtures."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from paths import FIXTURES, ROOT
from servelab.results.formats import EXPECTED, ImportFormatError, detect, read

IMPORTS = FIXTURES / "imports"
FILES = {
    "aiperf": IMPORTS / "aiperf-c1" / "profile_export.jsonl",
    "guidellm": IMPORTS / "guidellm-c1.json",
    "vllm-bench": IMPORTS / "vllm-bench-c4.json",
    "sglang-bench": FIXTURES / "sglang_bench_serving.jsonl",
}


@pytest.mark.parametrize("tool", list(FILES))
def test_each_tools_file_is_detected(tool):
    assert detect(FILES[tool]) == tool


def test_an_aiperf_artifact_folder_is_its_export():
    assert detect(IMPORTS / "aiperf-c1") == "aiperf"


@pytest.mark.parametrize("tool", list(FILES))
def test_every_run_in_a_file_is_a_source_with_requests_and_figures(tool):
    srcs = read(FILES[tool])
    assert srcs and all(s.tool == tool and s.rows for s in srcs)
    assert all(s.reported for s in srcs)  # the tool's own figures are there to compare with
    assert all("ttfts" not in s.summary for s in srcs)  # the tool's summary without per-request lists


def _truncated(tmp_path, src, name):
    p = tmp_path / name
    text = src.read_text()
    p.write_text(text[: len(text) // 2])
    return p


@pytest.mark.parametrize("tool", ["guidellm", "vllm-bench", "aiperf"])
def test_a_truncated_file_is_one_error_naming_it_and_the_formats(tmp_path, tool):
    p = _truncated(tmp_path, FILES[tool], FILES[tool].name)
    with pytest.raises(ImportFormatError) as e:
        read(p)
    msg = str(e.value)
    assert msg.startswith(f"{p}: ") and "\n" not in msg
    assert "truncated?" in msg and "expected" in msg


def test_a_foreign_json_names_every_format_expected(tmp_path):
    p = tmp_path / "foreign.json"
    p.write_text(json.dumps({"hello": "world", "results": [1, 2, 3]}))
    with pytest.raises(ImportFormatError) as e:
        detect(p)
    assert str(e.value) == f"{p}: no tool's result format recognised; expected one of: {EXPECTED}"


def test_the_wrong_tool_says_which_format_it_found(tmp_path):
    with pytest.raises(ImportFormatError, match="not aiperf's format \\(guidellm recognised\\)"):
        read(FILES["guidellm"], "aiperf")


def test_aiperfs_summary_alone_points_at_the_export_beside_it(tmp_path):
    with pytest.raises(ImportFormatError) as e:
        read(IMPORTS / "aiperf-c1" / "profile_export_aiperf.json")
    assert str(e.value).endswith(f"holds no per-request data: import {IMPORTS / 'aiperf-c1' / 'profile_export.jsonl'} "
                                 "beside it")
    alone = tmp_path / "profile_export_aiperf.json"
    alone.write_text((IMPORTS / "aiperf-c1" / "profile_export_aiperf.json").read_text())
    with pytest.raises(ImportFormatError, match="import the profile_export.jsonl AIPerf wrote beside it$"):
        read(alone)


def test_a_vllm_result_without_details_says_what_cannot_be_recomputed(tmp_path):
    res = json.loads(FILES["vllm-bench"].read_text())
    for k in ("ttfts", "itls", "input_lens", "output_lens", "latencies", "start_times", "errors", "generated_texts"):
        res.pop(k, None)
    p = tmp_path / "summary-only.json"
    p.write_text(json.dumps(res))
    with pytest.raises(ImportFormatError, match="without per-request data \\(12 requests, summary only\\): run it again "
                                                "with --save-result --save-detailed"):
        read(p)


def test_the_command_prints_one_line_exits_2_and_writes_nothing(tmp_path):
    bad = _truncated(tmp_path, FILES["guidellm"], "benchmarks.json")
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "servelab.cli", "import", str(bad), "--out", str(out)], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"servelab import: {bad}: not valid JSON") and "Traceback" not in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["benchmarks.json"]  # no run folder, no temporary folder


def test_guidellms_yaml_report_reads_as_its_json(tmp_path):
    import yaml

    p = tmp_path / "benchmarks.yaml"
    p.write_text(yaml.safe_dump(json.loads(FILES["guidellm"].read_text())))
    a, b = read(FILES["guidellm"]), read(p)
    assert detect(p) == "guidellm"
    assert [r["ttft_s"] for r in a[0].rows] == [r["ttft_s"] for r in b[0].rows]
    assert a[0].reported == b[0].reported


@pytest.mark.parametrize("what", ["folder", "records.jsonl", "run.json", "study"])
def test_a_servelab_run_folder_points_at_compare(tmp_path, what):
    import shutil

    run = IMPORTS / "servelab-c4"
    if what == "study":
        shutil.copytree(run, tmp_path / "study" / "data" / "servelab-c4")
        p = tmp_path / "study"
    else:
        p = run if what == "folder" else run / what
    with pytest.raises(ImportFormatError) as e:
        read(p)
    assert str(e.value) == (f"{p}: a servelab run folder: it needs no import; compare it with another run or study "
                            "with `servelab compare A B`")


def test_a_csv_is_refused_as_a_table_not_as_broken_json(tmp_path):
    p = tmp_path / "benchmarks.csv"
    p.write_text("Run Info,Run Info,Benchmark\nRun ID,Run Index,Type\nabc,0,generative_benchmark\n")
    with pytest.raises(ImportFormatError, match="a GuideLLM CSV summary holds no per-request data: import its JSON"):
        read(p)
    q = tmp_path / "table.txt"
    q.write_text("a,b,c\n1,2,3\n")
    with pytest.raises(ImportFormatError) as e:
        read(q)
    assert "a CSV table, not a per-request result" in str(e.value) and "truncated" not in str(e.value)
