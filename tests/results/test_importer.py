"""`servelab import`: each tool's file becomes an ordinary run folder (records with servelab's
fields, levels.jsonl, run.json marked imported, the tool's summary beside, the harmonised figures),
servelab's summary works on it, and the tool's figures agree with servelab's recomputation where
the definitions match."""

from __future__ import annotations

import json

import pytest

from paths import FIXTURES
from servelab.errors import RunFolderExists
from servelab.results.importer import HARMONISED, SOURCE_SUMMARY, import_files
from servelab.runfolder import LEVELS, RECORDS, RUN_JSON, RunFolder, read_jsonl
from servelab.schema.runfiles import RequestRecord

IMPORTS = FIXTURES / "imports"
CASES = {
    "aiperf": ([IMPORTS / "aiperf-c1" / "profile_export.jsonl"], "0.13.0"),
    "guidellm": ([IMPORTS / "guidellm-c1.json"], "0.8.1"),
    "vllm-bench": ([IMPORTS / "vllm-bench-c4.json"], None),
    "sglang-bench": ([FIXTURES / "sglang_bench_serving.jsonl"], "0.5.16"),
}


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    root = tmp_path_factory.mktemp("imports")
    return {tool: import_files(files, out=root / tool, study="tools", config=tool)
            for tool, (files, _) in CASES.items()}


@pytest.mark.parametrize("tool", list(CASES))
def test_an_import_is_an_ordinary_run_folder(imported, tool):
    res = imported[tool]
    rf = RunFolder(res.path)
    for f in (RECORDS, LEVELS, RUN_JSON, SOURCE_SUMMARY, HARMONISED):
        assert (res.path / f).exists(), f
    recs = rf.records
    assert set(RequestRecord.peer_columns()) <= set(recs.columns)
    assert (recs["study"] == "tools").all() and (recs["config"] == tool).all()
    run = rf.run
    assert run["status"] == "complete" and run["imported"]["tool"] == tool
    assert run["imported"]["version"] == CASES[tool][1]
    assert [f["name"] for f in run["imported"]["files"]] == [p.name for p in CASES[tool][0]]
    assert (res.path / "source" / CASES[tool][0][0].name).exists()
    assert run["headline"]["sent"] == int((~recs["warmup"]).sum())
    # servelab's summary works on it: one row per level, with TTFT and aggregate tok/s
    s = rf.summary
    assert len(s) == len(read_jsonl(res.path / LEVELS)) == res.levels
    assert (s["ttft_p50_s"] > 0).all() and (s["aggregate_output_tps"] > 0).all()


@pytest.mark.parametrize("tool", list(CASES))
def test_every_figure_with_servelabs_definition_agrees_within_2_percent(imported, tool):
    rows = imported[tool].harmonised
    same = rows[(rows["same"] == True) & rows["tool_value"].notna()]  # noqa: E712
    assert len(same) >= 1
    assert same["within"].all(), same[["field", "tool_value", "servelab", "diff_pct"]]
    # a figure beyond the tolerance carries its reason from the definitions table
    over = rows[rows["within"] == False]  # noqa: E712
    assert over["reason"].notna().all() and not over["reason"].str.startswith("unexplained").any()


def test_guidellm_says_which_metric_its_data_cannot_give(imported):
    h = json.loads((imported["guidellm"].path / HARMONISED).read_text())
    assert "itl_s" in h["not_recomputable"]
    rows = [r for r in h["rows"] if r["metric"] == "itl_s"]
    assert rows and all(r["reason"].startswith("cannot be recomputed") for r in rows)
    assert RunFolder(imported["guidellm"].path).summary["itl_p50_s"].isna().all()


def test_aiperf_figures_match_its_summary_exactly_where_it_is_servelabs_definition(imported):
    rows = imported["aiperf"].harmonised.set_index("field")
    # the aggregate: total output tokens / (last response - first request), the same arithmetic; AIPerf
    # times the run on its perf counter, the export's request stamps are wall-clock ns (-0.016 % here)
    assert rows.loc["output_token_throughput.avg", "diff_pct"] == pytest.approx(0, abs=0.1)
    assert rows.loc["time_to_first_token.p50", "diff_pct"] == pytest.approx(0, abs=1e-6)
    assert rows.loc["inter_chunk_latency.p50", "diff_pct"] == pytest.approx(0, abs=1e-6)


def test_an_existing_run_folder_is_not_replaced_without_force(imported, tmp_path):
    path = imported["vllm-bench"].path
    before = (path / RECORDS).read_bytes()
    with pytest.raises(RunFolderExists):
        import_files(CASES["vllm-bench"][0], out=path)
    assert (path / RECORDS).read_bytes() == before
    again = import_files(CASES["vllm-bench"][0], out=path, force=True)
    assert again.requests == imported["vllm-bench"].requests
    assert sorted(p.name for p in path.parent.iterdir() if p.name.startswith(".")) == []  # no temporary folder left


def test_several_files_of_one_level_are_its_rounds(tmp_path):
    f = CASES["vllm-bench"][0][0]
    res = import_files([f, f], out=tmp_path / "two")
    recs = RunFolder(res.path).records
    assert sorted(recs["round"].unique()) == [0, 1] and res.rounds == 2 and res.levels == 1
    assert recs["seq"].is_unique
