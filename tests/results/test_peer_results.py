"""Real result files of AIPerf, GuideLLM and `vllm bench serve`, taken from public repositories
(../shared/peer-results, provenance and each file's own figures in its SOURCES.md; read there, never
copied here): every file with per-request data imports, recognised by its own format's markers, its
measurement window and sample told; its figures recomputed by the tool's definition agree with the
file's own; every file without per-request data is refused with one line naming what to pass
instead, exit 2, nothing written."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from paths import ROOT
from servelab.analysis.harmonise import agreement, statistic, unexplained
from servelab.results.formats import ImportFormatError, read
from servelab.results.importer import import_files
from servelab.runfolder import RunFolder

PEERS = ROOT.parent / "shared" / "peer-results"
pytestmark = pytest.mark.skipif(not PEERS.is_dir(), reason="../shared/peer-results is not beside the checkout")

AIPERF_01 = "aiperf/v0.1.x-gpt-oss-20b-c100-run1"
AIPERF_08 = "aiperf/v0.8.0-llama3.2-3b-c1"
G03 = "guidellm/v0.3-unit-fixture/benchmarks_stripped"
G05 = "guidellm/v0.5.0.dev0"
QWEN30 = f"{G05}/Qwen_Qwen3-30B-A3B_tp4_quant-fp8_benchmarks.json"
QWEN4 = f"{G05}/Qwen_Qwen3-4B-Thinking-2507_tp4_quant-fp8_benchmarks.json"

#: file -> (tool, schema, stated version, stored, measured, counted, excluded, figures within 5 % / of)
IMPORTED = {
    f"{AIPERF_01}/profile_export.jsonl": ("aiperf", "aiperf-0.1", None, 100, 100, 100, {}, (8, 8)),
    f"{AIPERF_08}/profile_export.jsonl": ("aiperf", "aiperf-0.2", "0.8.0", 20, 20, 20, {}, (9, 9)),
    f"{G03}.json": ("guidellm", "guidellm-0.3", None, 1, 1, 47, {}, (0, 8)),
    f"{G03}.yaml": ("guidellm", "guidellm-0.3", None, 1, 1, 47, {}, (0, 8)),
    QWEN30: ("guidellm", "guidellm-v1", "0.5.0.dev0", 24, 19, 19, {"warm-up": 2, "cool-down": 3}, (8, 8)),
    QWEN4: ("guidellm", "guidellm-v1", "0.5.0.dev0", 4, 4, 4, {}, (8, 8)),
}
#: file -> the one line's ending: what to pass instead
REFUSED = {
    f"{AIPERF_01}/profile_export_aiperf.csv": "an AIPerf CSV summary (profile_export_aiperf.csv) holds no per-request "
                                              f"data: import {PEERS / AIPERF_01 / 'profile_export.jsonl'} beside it",
    f"{AIPERF_01}/profile_export_aiperf.json": "an AIPerf summary (profile_export_aiperf.json) holds no per-request "
                                               f"data: import {PEERS / AIPERF_01 / 'profile_export.jsonl'} beside it",
    f"{AIPERF_08}/profile_export_aiperf.json": "an AIPerf summary (profile_export_aiperf.json) holds no per-request "
                                               f"data: import {PEERS / AIPERF_08 / 'profile_export.jsonl'} beside it",
    **{f"vllm-bench/v0.25.1/{n}": "a `vllm bench serve` result without per-request data (8 requests, summary only): "
                                  "run it again with --save-result --save-detailed and import that JSON"
       for n in ("bench_serve_v0.25.1.json", "bench_serve_all_requests_failed_v0.25.1.json",
                 "sweep_max_num_seqs=4_max_concurrency=2_run=0.json")},
}


def test_the_lists_cover_every_file_there():
    files = {str(p.relative_to(PEERS)) for p in PEERS.rglob("*") if p.is_file() and p.name != "SOURCES.md"}
    assert files == set(IMPORTED) | set(REFUSED)


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    root = tmp_path_factory.mktemp("peers")
    return {f: import_files([PEERS / f], out=root / str(i)) for i, f in enumerate(IMPORTED)}


@pytest.mark.parametrize("name", list(IMPORTED))
def test_each_file_with_per_request_data_imports_by_its_own_format(imported, name):
    tool, schema, version, stored, measured, counted, excluded, _ = IMPORTED[name]
    (src,) = read(PEERS / name)
    assert (src.tool, src.schema, src.version) == (tool, schema, version)
    assert (len(src.rows), src.measured, src.counted, src.excluded) == (stored, measured, counted, excluded)
    assert src.sampled == (measured < counted)
    run = RunFolder(imported[name].path).run["imported"]
    assert run["schema"] == schema and run["runs"][0]["counted"] == counted
    assert run["runs"][0]["measured"] == measured and run["runs"][0]["excluded"] == excluded


@pytest.mark.parametrize("name", list(IMPORTED))
def test_the_figures_recomputed_by_the_tools_definition_agree_with_the_files_own(imported, name):
    h = imported[name].harmonised
    assert agreement(h) == IMPORTED[name][-1]
    assert unexplained(h).empty
    reported = h[h["tool_value"].notna()]
    if IMPORTED[name][4] < IMPORTED[name][5]:  # a sampled report says so on every figure it cannot recompute
        assert reported["reason"].str.startswith("sampled report: 1 of the 47 requests the tool counted").all()
        assert reported["servelab"].isna().all()


def test_at_least_28_figures_agree_within_5_percent(imported):
    ok = sum(agreement(imported[f].harmonised)[0] for f in IMPORTED)
    total = sum(agreement(imported[f].harmonised)[1] for f in IMPORTED)
    assert ok >= 28 and (ok, total) == (33, 49)


def test_guidellm_leaves_its_warm_up_and_cool_down_out_as_the_tool_did(imported):
    """The synchronous GuideLLM 0.5 run stores 23 successful requests; its metrics count the 19 that
    overlap its measurement window. Counting all 23 put a 1.24 s cold start into servelab's TTFT."""
    recs = RunFolder(imported[QWEN30].path).records
    measured = recs[~recs["warmup"]]
    assert len(measured) == 19 and sorted(recs.loc[recs["warmup"], "excluded"]) == ["cool-down"] * 3 + ["warm-up"] * 2
    assert recs["ttft_s"].max() == pytest.approx(1.2435975, rel=1e-6)  # the cold start: kept, flagged
    ttft = measured["ttft_s"].dropna().to_numpy()
    assert statistic(ttft, "mean") * 1000 == pytest.approx(59.9928153, rel=1e-9)  # the file's own mean
    # its p99 (SOURCES.md: 72.798 ms; 988 ms with the warm-up counted): a sample value, the largest of 19
    assert np.max(ttft) * 1000 == pytest.approx(72.79777527, rel=1e-9)


def test_aiperf_throughput_differs_by_its_duration_window_and_says_so(imported):
    h = imported[f"{AIPERF_08}/profile_export.jsonl"].harmonised.set_index("field")
    r = h.loc["output_token_throughput.avg"]
    assert r["diff_pct"] == pytest.approx(10.668, abs=0.01)  # the trailing 20 s timeout is in servelab's round
    assert abs(r["tool_def_diff_pct"]) < 1e-4  # first successful request -> last successful response
    assert r["reason"].startswith("definitional (duration window): AIPerf's benchmark duration runs from the first")


def test_aiperf_0_1_records_read_with_the_old_tags(imported):
    recs = RunFolder(imported[f"{AIPERF_01}/profile_export.jsonl"].path).records
    ok = recs[recs["ok"]]
    assert len(ok) == 89 and (~recs["ok"]).sum() == 11  # 11 cancelled (code 499)
    assert recs.loc[~recs["ok"], "error_detail"].str.startswith("Request was cancelled").all()
    # SOURCES.md: TTFT p99 3833.39 ms, output tokens (reasoning included) 21,624 in 9.3178 s
    assert np.percentile(ok["ttft_s"], 99) * 1000 == pytest.approx(3833.3894, rel=1e-6)
    assert ok["output_tokens"].sum() == 21624 and ok["reasoning_tokens"].sum() == 19792
    assert RunFolder(imported[f"{AIPERF_01}/profile_export.jsonl"].path).summary["concurrency"].tolist() == [100]


def test_the_json_and_yaml_of_one_guidellm_report_read_alike():
    a, b = read(PEERS / f"{G03}.json")[0], read(PEERS / f"{G03}.yaml")[0]
    assert pd.DataFrame(a.rows).equals(pd.DataFrame(b.rows)) and a.reported == b.reported


@pytest.mark.parametrize("name", list(REFUSED))
def test_each_file_without_per_request_data_is_refused_naming_what_to_pass(name):
    with pytest.raises(ImportFormatError) as e:
        read(PEERS / name)
    assert str(e.value) == f"{PEERS / name}: {REFUSED[name]}"


def test_the_command_refuses_in_one_line_exit_2_and_writes_nothing(tmp_path):
    for name in REFUSED:
        out = tmp_path / "run"
        r = subprocess.run([sys.executable, "-m", "servelab.cli", "import", str(PEERS / name), "--out", str(out)],
                           cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert r.stderr.strip().splitlines() == [f"servelab import: {PEERS / name}: {REFUSED[name]}"]
        assert not out.exists() and list(tmp_path.iterdir()) == []
