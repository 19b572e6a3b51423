"""The run files' types (schema.runfiles): every committed run.json, engine.json, levels.jsonl and
records.jsonl of every earlier version loads through them; each is written and read back through the
run folder's writers and readers; a file of the wrong shape is one RunFileError naming it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from paths import ROOT

from servelab.errors import RunFileError, UserError
from servelab.measure.runinfo import base_record
from servelab.runfolder import (ENGINE_JSON, LEVELS, RECORDS, RUN_JSON, RunFolder, read_checked, read_engine,
                                read_typed, write_engine)
from servelab.schema import FORMAT_VERSION
from servelab.schema.runfiles import LINE_FORMAT, EngineHandle, LevelSummary, RequestOutcome, RequestRecord, RunInfo

# every tree where run folders are committed: published studies, benchmark results, test fixtures
TREES = ("reports/*/data", "benchmarks/results", "tests/fixtures")
TYPED = (RUN_JSON, ENGINE_JSON, LEVELS, RECORDS)


def _committed(name: str) -> list[Path]:
    return sorted(p for tree in TREES for base in ROOT.glob(tree) for p in base.rglob(name))


def _first_key(path: Path) -> str:
    return next(iter(json.loads(path.read_text())))


def test_every_committed_run_file_loads_through_its_type():
    seen: dict[str, set[int]] = {}
    counts = {}
    for name in TYPED:
        files = _committed(name)
        counts[name] = len(files)
        for p in files:
            if name.endswith(".jsonl"):
                raw = [json.loads(ln) for ln in p.read_text().splitlines() if ln.strip()]
                rows = read_typed(p)  # every line validated
                assert len(rows) == len(raw), p
                versions = {r.get("format_version", 1) for r in raw}
            else:
                data = read_checked(p)
                versions = {data.get("format_version", 1)}
            seen.setdefault(name, set()).update(versions)
        for p in files if name == RUN_JSON else ():
            rf = RunFolder(p.parent)
            assert rf.info.study and rf.info.config and rf.info.status in ("complete", "partial"), p
            assert rf.info.server.base_url, p
    assert counts[RUN_JSON] >= 49 and counts[RECORDS] >= 49 and counts[LEVELS] >= 49, counts
    # run.json: servelab 0.1 (no key), 2 and 3; the lines: all written before they carried a version
    assert seen[RUN_JSON] <= {1, 2, FORMAT_VERSION} and {1, FORMAT_VERSION} <= seen[RUN_JSON]
    assert seen[RECORDS] <= {1, LINE_FORMAT} and seen[LEVELS] <= {1, LINE_FORMAT}


def test_every_published_report_reads_its_runs_typed():
    from servelab.report.load import load_study_data

    for sj in sorted(ROOT.glob("reports/*/data/study.json")):
        sd = load_study_data(sj.parent.parent)
        for cid in sd.config_ids:
            info = sd.info(cid)
            assert isinstance(info, RunInfo) and info.config == cid
            assert info.engine_kind == (sd.runs[cid].get("engine_params") or {}).get("kind")


def _record(seq: int, ok: bool = True) -> dict:
    """A request record's line as the runner writes it (measure.runner.LevelRunner.record)."""
    res = RequestOutcome(ok=ok, http_status=200, start_s=10.0 + seq, sent_unix_s=1.7e9 + seq, end_s=0.5, ttft_s=0.1,
                 e2e_s=0.5, prompt_tokens=64, output_tokens=9, n_chunks=10, n_text_chunks=9,
                 chunk_times_s=[0.1 + 0.05 * i for i in range(9)], finish_reason="length", output_chars=40)
    return {"study": "s", "config": "c", "level": 0, "bucket": "b", "target_input_tokens": 64,
            "target_output_tokens": 9, "shared_prefix": False, "concurrency": 2, "rate_rps": 0.0,
            "arrival": "closed", "round": 0, "warmup": False, "seq": seq, "cache_salt": "x", "scheduled_s": None,
            "send_lag_s": None, "source": "synthetic", **res.with_rates().model_dump()}


def test_records_and_levels_written_and_read_through_their_types(tmp_path):
    rf = RunFolder(tmp_path)
    recs = [_record(0), _record(1)]
    level = {"level": 0, "label": "b c=2", "status": "complete", "sent": 2, "failed": 0, "measured_s": 1.5,
             "counters": {"generation_tokens_total": 18.0, "spec_accepted_per_pos_total": [1.0, 2.0],
                          "preemptions_total": None}, "sampling": {"stopped": "settled", "measured_rounds": 2}}
    with rf.writer(RECORDS) as w, rf.writer(LEVELS) as lw:
        for r in recs:
            w.write(r)
        lw.write(level)
    # on disk: the version first, then the keys as the runner gave them
    for name, want in ((RECORDS, recs[0]), (LEVELS, level)):
        first = json.loads((tmp_path / name).read_text().splitlines()[0])
        assert list(first) == ["format_version", *want] and first["format_version"] == LINE_FORMAT
    # read back: the same rows (the version is the file's concern), typed by the models
    assert rf.records.to_dict("records")[1]["chunk_times_s"] == recs[1]["chunk_times_s"]
    assert list(rf.records.columns) == list(recs[0])
    assert rf.levels == [{**level, "config": "c"}]
    typed = RequestRecord.model_validate(read_typed(tmp_path / RECORDS)[0])
    assert typed.ok and typed.output_tokens == 9 and typed.decode_tps == pytest.approx(8 / 0.4)
    lv = LevelSummary.model_validate(read_typed(tmp_path / LEVELS)[0])
    assert lv.sampling.measured_rounds == 2 and lv.counters["spec_accepted_per_pos_total"] == [1.0, 2.0]
    assert not rf.summary.empty


def test_a_typed_record_is_written_as_its_line_and_read_back_typed(tmp_path):
    """The runner's `RequestRecord` goes to disk as the dict line would (where it ran first, then the
    client's outcome, then the source's keys) and comes back as the same typed row."""
    rf = RunFolder(tmp_path)
    line = {**_record(0), "prompt_id": "p1", "session_id": "L0-r0-s0"}
    typed = RequestRecord.model_validate(line)
    with rf.writer(RECORDS) as w:
        w.write(typed)
        w.write(line)
    first, second = (json.loads(x) for x in (tmp_path / RECORDS).read_text().splitlines())
    assert first == second and list(first)[:3] == ["format_version", "study", "config"]
    assert list(first)[-1] == "session_id" and first["session_id"] == "L0-r0-s0"
    back = rf.request_records()
    assert back[0] == back[1] and back[0].decode_tps == pytest.approx(8 / 0.4) and back[0].prompt_id == "p1"


def test_the_peer_columns_are_the_record_fields_every_importer_fills():
    cols = RequestRecord.peer_columns()
    assert cols[:2] == ["config", "bucket"] and {"ttft_s", "decode_tps", "chunk_times_s", "tool"} <= set(cols)
    assert set(cols) <= set(RequestRecord.model_fields) and "output_text" not in cols


def test_run_json_written_and_read_through_its_type(tmp_path):
    rf = RunFolder(tmp_path)
    rec = base_record("s", "c")
    rec.update({"server": {"mode": "launched", "base_url": "http://127.0.0.1:1", "version": "0.32.0",
                           "command": ["vllm", "serve"], "startup_s": 12.5, "peak_rss_bytes": 1 << 30},
                "model_name": "m", "workload": {"rounds": 1}, "engine_params": {"kind": "vllm", "load_format": "dummy",
                                                                               "args": {"dtype": "bfloat16"}},
                "model": {"path": "x", "revision": "sha256 00", "facts": {"architecture": "Llama"}}})
    rf.write_run(rec)
    assert _first_key(tmp_path / RUN_JSON) == "format_version"
    assert rf.run == {"format_version": FORMAT_VERSION, **rec}
    info = rf.info
    assert (info.format_version, info.status, info.server.version, info.server.startup_s) == (3, "running", "0.32.0",
                                                                                              12.5)
    assert (info.engine_kind, info.load_format, info.facts) == ("vllm", "dummy", {"architecture": "Llama"})
    assert info.servelab.version and info.client_host.cpu_count
    rf.write_run({**rec, "status": "complete", "records": 2, "headline": {"sent": 2, "ok": 2, "success_rate": 1.0}})
    assert (rf.info.status, rf.info.records, rf.info.headline.success_rate) == ("complete", 2, 1.0)
    assert RunFolder(tmp_path / "none").info == RunInfo()  # a folder without run.json: an empty record


def test_engine_json_written_and_read_through_its_type(tmp_path):
    handle = {"mode": "launched", "base_url": "http://127.0.0.1:8011", "model": "/m", "pid": 123,
              "info": {"engine": "vllm", "version": "0.32.0"}, "tokenizer_dir": "/m"}
    write_engine(tmp_path / ENGINE_JSON, handle)
    assert _first_key(tmp_path / ENGINE_JSON) == "format_version"
    back = read_engine(tmp_path / ENGINE_JSON)
    assert back == {"format_version": LINE_FORMAT, **handle}
    assert EngineHandle.model_validate(back).pid == 123
    old = tmp_path / "old" / ENGINE_JSON  # before the version (format 1): still read
    old.parent.mkdir()
    old.write_text(json.dumps({"base_url": "http://x", "model": "m", "info": {}}))
    assert EngineHandle.model_validate(read_engine(old)).format_version == 1
    with pytest.raises(RunFileError, match=r"engine.json: not a servelab engine.json: pid: "):
        write_engine(tmp_path / "bad" / ENGINE_JSON, {**handle, "pid": "abc"})
    assert not (tmp_path / "bad").exists()


def test_a_malformed_run_json_is_one_error_naming_the_file(tmp_path):
    (tmp_path / RUN_JSON).write_text(json.dumps({"study": "s", "config": "c", "status": "complete",
                                                 "server": {"startup_s": "slow"}}))
    with pytest.raises(RunFileError) as e:
        RunFolder(tmp_path).run
    msg = str(e.value)
    assert str(tmp_path / RUN_JSON) in msg and "server.startup_s" in msg and "\n" not in msg
    assert isinstance(e.value, UserError)
    (tmp_path / RUN_JSON).write_text('{"study": "s", ')
    with pytest.raises(RunFileError, match=r"run.json: not JSON"):
        RunFolder(tmp_path).info


def test_a_malformed_record_line_is_one_error_naming_the_file_and_line(tmp_path):
    lines = [json.dumps(_record(0)), json.dumps({**_record(1), "ok": "maybe"}), '{"torn": ']
    (tmp_path / RECORDS).write_text("\n".join(lines))
    with pytest.raises(RunFileError, match=rf"{RECORDS} line 2: not a servelab {RECORDS}: ok: .*\"maybe\""):
        RunFolder(tmp_path).records
    # a torn last line (a killed writer) is still skipped, not an error
    (tmp_path / RECORDS).write_text("\n".join([lines[0], lines[2]]))
    assert len(RunFolder(tmp_path).records) == 1


def test_the_writer_refuses_a_record_of_the_wrong_shape(tmp_path):
    rf = RunFolder(tmp_path)
    with rf.writer(RECORDS) as w:
        w.write(_record(0))
        with pytest.raises(RunFileError, match=r"a line for .*records.jsonl: not a servelab records.jsonl: level"):
            w.write({**_record(1), "level": "first"})
    assert len((tmp_path / RECORDS).read_text().splitlines()) == 1


def test_design_json_is_written_whole_and_merged_through_its_type(tmp_path):
    """design.json keeps every field of a level (its defaults too: a reader of the raw file sees
    `stopped: fixed`), and a later write merges its fields over the launch's."""
    from servelab.runfolder import read_design, write_design
    from servelab.schema.runfiles import DesignRecord, LaunchTimes, SampledLevel

    write_design(tmp_path, DesignRecord(interleaved=True, lanes=2, launch=LaunchTimes(wall_s=3.0, per_config_s={"a": 1.0})))
    lv = SampledLevel(label="in20-out24 c=1")
    lv.rounds, lv.seconds = {"a": 3, "b": 3}, 2.5
    write_design(tmp_path, DesignRecord(interleaved=True, order=["a", "b"], levels=[lv]), update=True)
    raw = json.loads((tmp_path / "design.json").read_text())
    assert list(raw)[0] == "format_version" and raw["lanes"] == 2 and raw["order"] == ["a", "b"]
    assert raw["levels"][0]["stopped"] == "fixed" and set(raw["levels"][0]) == set(SampledLevel.model_fields)
    d = read_design(tmp_path)
    assert d.launch.per_config_s == {"a": 1.0} and d.levels[0].rounds == {"a": 3, "b": 3}
    assert read_design(tmp_path / "nowhere") == DesignRecord()
