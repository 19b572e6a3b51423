"""The fault matrix at 256 concurrent streams: the reference server injects every fault class
in one mixed run (`Behaviour.fault_mix`), and every request it saw has exactly one record,
each fault its class, nothing double-counted. (Across Ray workers with one killed mid-round:
tests/measure/test_ray_pool.py.)"""

from __future__ import annotations

from collections import Counter

from servelab.hosts.base import Server
from servelab.measure.runinfo import base_record
from servelab.measure.runner import run_workload
from servelab.runfolder import read_jsonl
from servelab.schema import Bucket, Workload

# fault -> the record's error_kind (no_usage: counted on the client, so the record is ok)
CLASS = {"http_429": "http_status", "http_500": "http_status", "http_503": "http_status", "reset": "disconnect",
         "stall": "timeout", "malformed": "malformed_stream", "empty_choices": "no_tokens",
         "no_done": "malformed_stream", "no_usage": None}
MIX = (None, "http_429", None, "reset", None, "malformed", "http_503", None, "no_done", "empty_choices", None,
       "stall", "http_500", None, "no_usage", None)  # 16 long: 7 clean, 9 faults


def account(recs: list[dict], faults: dict[str, int], requests: int) -> dict[str, int]:
    """Records by class, checked against what the server injected (the accounting)."""
    by_kind = Counter(r["error_kind"] for r in recs if not r["ok"])
    want = Counter()
    for f, n in faults.items():
        if CLASS[f]:
            want[CLASS[f]] += n
    assert by_kind == want, (by_kind, want)
    ok = sum(r["ok"] for r in recs)
    assert ok == requests - sum(want.values())
    assert sum(r["ok"] and r["output_tokens_source"] == "client" for r in recs) == faults.get("no_usage", 0)
    return {"server_requests": requests, "records": len(recs), "ok": ok, **dict(by_kind)}


def test_every_fault_class_at_256_streams_one_record_per_request(refserver, tmp_path):
    s = refserver(ttft_s=0.01, itl_s=0.005, fault_mix=MIX)
    wl = Workload(buckets=[Bucket(input_tokens=20, output_tokens=16)], concurrency=[256], warmup_rounds=0, rounds=2,
                  requests_per_round=2, timeout_s=8.0, cache_salt=True)  # stall: waits the timeout
    res = run_workload(Server(s.url, "ref"), wl, tmp_path / "r", study="t", config_id="r",
                       record=base_record("t", "r"), progress=False, metrics_interval_s=0)
    recs = read_jsonl(tmp_path / "r" / "records.jsonl")
    assert res.status == "complete"
    assert len(recs) == 2 * 2 * 256 == s.stats.requests  # every request the server saw, once
    assert sorted(r["seq"] for r in recs) == list(range(1024))
    assert s.stats.faults == {f: 1024 // 16 for f in MIX if f}  # 64 of each class
    got = account(recs, s.stats.faults, s.stats.requests)
    assert got["ok"] == 1024 - 8 * 64 and got["http_status"] == 3 * 64 and got["malformed_stream"] == 2 * 64
    assert all(r["output_tokens"] == 16 for r in recs if r["ok"])
    assert s.stats.running == 0 or all(r["error_kind"] != "timeout" for r in recs if r["ok"])
    print("256 streams:", got)
