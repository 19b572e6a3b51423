"""The smoke runs of benchmarks/ (issue 60): every script there has a `--smoke DIR` mode (the smallest
workload through every code path, the reference server standing in for an engine, everything written
under DIR), which tests/benchmarks/ runs in `make test`'s first pass, so that a renamed module or a
changed signature fails a test instead of someone's repeat of a finished study.

Each script's check looks at what its smoke run wrote or printed (keys, rows, the tools and levels it
went through), never at a value one machine measured. The published results and reports are compared
before and after each run: a smoke run writes nothing there."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from paths import ROOT

BENCHMARKS = ROOT / "benchmarks"
PUBLISHED = (BENCHMARKS / "results", ROOT / "reports")
TIMEOUT_S = 180  # each run takes seconds; a 2-core machine busy with the other test worker, a few times that


def scripts() -> list[str]:
    return sorted(p.name for p in BENCHMARKS.glob("*.py"))


def published_state() -> dict[str, str]:
    """What git sees changed, added or removed under the published results and reports, each file with the hash of
    its content now (a file written again with the same bytes is no change: another test worker may render)."""
    out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all", "--", *map(str, PUBLISHED)],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    paths = [line[3:] for line in out.splitlines()]
    return {p: subprocess.run(["git", "hash-object", p], cwd=ROOT, capture_output=True, text=True).stdout.strip()
            if (ROOT / p).is_file() else "gone" for p in paths}


def run(script: str, out: Path) -> str:
    """`python benchmarks/SCRIPT --smoke OUT` from the repository root; its stdout. Fails on a non-zero
    exit, on a timeout, and when it changed a published file."""
    before = published_state()
    r = subprocess.run([sys.executable, str(BENCHMARKS / script), "--smoke", str(out)], cwd=ROOT,
                       capture_output=True, text=True, timeout=TIMEOUT_S)
    assert r.returncode == 0, f"{script} --smoke exited {r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"
    after = published_state()
    assert after == before, f"{script} --smoke changed published files: " + ", ".join(
        sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k)))
    return r.stdout


def _json(p: Path) -> Any:
    return json.loads(p.read_text())


def _all_ok(rows: list[dict[str, Any]]) -> None:
    """Every request of every run came back (the reference server serves them all)."""
    assert rows and all(r["ok"] == r["sent"] > 0 for r in rows), [(r.get("tool"), r["ok"], r["sent"]) for r in rows]


def compare_vllm_bench(out: Path, stdout: str) -> None:
    r = _json(next(out.glob("compare.json")))
    assert {"reference", "vllm_cpu", "overhead", "host", "settings"} <= r.keys()
    for part in ("reference", "vllm_cpu", "overhead"):
        _all_ok(r[part]["runs"])
        assert {x["tool"] for x in r[part]["runs"]} == {"servelab", "vllm"}
    assert {x["tool"] for x in r["reference"]["table"]} >= {"servelab", "vllm bench serve", "truth (programmed)"}
    assert any("reported_ttft_p50_s" in x for x in r["vllm_cpu"]["runs"])  # vllm bench's own numbers kept
    assert r["vllm_cpu"]["engine"]["engine_params"]["kind"] == "vllm"  # the engine planned, not started
    assert sorted({x["c"] for x in r["overhead"]["table"]}) == [2, 4]
    assert set(r["overhead"]["sustained"]) == {"servelab", "vllm"}
    assert (out / r["started"]).is_dir()  # the raw runs under DIR, not runs/compare


def client_cpu(out: Path, stdout: str) -> None:
    rows = _json(out / "client-cpu.json")["rows"]
    assert {r["variant"] for r in rows} == {"servelab", "httpx-h11", "aiohttp", "aiohttp-parser"}
    assert all(r["chunks"] == r["expected"] > 0 for r in rows)  # every token of every stream arrived


def soak(out: Path, stdout: str) -> None:
    r = _json(out / "soak.json")
    assert r["samples"] and r["ok"] > 0 and r["failed_by_kind"] == {}
    assert r["records"] == r["ok"] and r["server_requests_completed"] >= r["ok"]
    assert {"rss_slope_mib_per_min", "lag_p99_ms_last_min"} <= r.keys()


def ray_scaleout(out: Path, stdout: str) -> None:
    r = _json(out / "ray-scaleout.json")
    configs = {"local-1", "local-2", "ray-2"}
    assert {x["config"] for x in r["sustained"]} == configs and all(x["levels"] for x in r["sustained"])
    assert {x["config"] for x in r["overhead"]} == configs
    assert all(x["ok"] == x["requests"] for x in r["overhead"])
    assert all(x["clocks"] for x in r["overhead"] if x["backend"] == "ray")  # each Ray worker's clock offset
    assert r["driver"]["record_json_bytes"] > 0
    assert r["driver_at_rate"]["ok"] == r["driver_at_rate"]["requests"]


def capacity_agreement(out: Path, stdout: str) -> None:
    r = _json(out / "agreement.json")
    assert len(r["runs"]) == 1 and all(x["bracket"] for x in r["runs"])
    assert [g["concurrency"] for g in r["grid"]] == [1, 2, 3]
    assert {"brackets_overlap", "grid_capacity", "grid_capacity_in_every_bracket"} <= r.keys()


def capacity_repeat(out: Path, stdout: str) -> None:
    rep, fit = _json(out / "repeat.json"), _json(out / "fit.json")
    assert len(rep["runs"]) == len(fit["runs"]) == 2
    assert all(x["bracket"] and x["trials"] and x["requests"] > 0 for x in rep["runs"])
    assert [x["bracket"] for x in fit["runs"]] == [x["bracket"] for x in rep["runs"]]  # the replay reads the same
    assert "fits" in fit["agreement"]


def tools_study(out: Path, stdout: str) -> None:
    study = out / "local-cpu-tools"
    for page in ("index.html", "compare-aiperf.html", "compare-rerun.html"):
        assert "<html" in (study / page).read_text()[:500].lower()
    for tool in ("servelab", "aiperf", "guidellm", "vllm-bench"):
        assert (study / "imports" / tool / "records.jsonl").stat().st_size > 0
    assert {t["tool"] for t in _json(study / "times.json")} == {"servelab", "aiperf", "guidellm", "vllm-bench"}
    assert "--concurrency" in (out / "tools-raw" / "raw" / "aiperf" / "r0-c1" / "tool.log").read_text()  # its command


def noisy_neighbour(out: Path, stdout: str) -> None:
    assert "noise: 1 busy processes from" in stdout and "servelab bench: exit 0" in stdout
    assert re.search(r"^  rewrite c=1: rounds \d+", stdout, re.M)  # the published design.json read
    assert (out / "runs" / "local-cpu" / "smoke" / "records.jsonl").stat().st_size > 0


def verdict_noise(out: Path, stdout: str) -> None:
    r = _json(out / "verdict-noise.json")
    assert len(r) == 2 and all(x["levels"] and x["verdicts"] for x in r)
    assert "verdicts of the last two folders agree on" in stdout


def verdict_agreement(out: Path, stdout: str) -> None:
    m = re.search(r"changes: (\d+) of (\d+) level verdicts agree", stdout)
    assert m and m[1] == m[2] != "0", stdout[-500:]  # one study against itself


def verdict_reruns(out: Path, stdout: str) -> None:
    r = _json(out / "verdict-reruns.json")
    [pair] = r["pairs"]
    assert pair["agree"] == pair["of"] > 0 and pair["opposite"] == 0  # one study taken as two runs
    assert r["per_run"].keys() == {"a", "b"} and r["expected_agreement"]


def prediction_errors(out: Path, stdout: str) -> None:
    rows = _json(out / "prediction_errors.json")
    assert {r["study"] for r in rows} == {"h200-perfmodel", "h200-llama8b-vllm"}
    assert {r["source"] for r in rows} == {"stored before measurement", "computed now"}


def h100_predictions(out: Path, stdout: str) -> None:
    r = _json(out / "h100-predictions.json")
    assert set(r["configurations"]) >= {"gemma2-27b", "ernie45", "olmoe", "granite-moe", "qwen3-8b"}
    assert r["calibration"].startswith("nvidia-")  # the H100's own entry, or the H200's carried to it
    assert {c["kinds"]["tpot"] for c in r["configurations"].values()} == {"estimate"}
    assert r["configurations"]["ernie45"]["router_ties"] and "spread_router" in r["configurations"]["ernie45"]
    assert len(re.findall(r"^committed: ", stdout, re.M)) == 8  # the committed file against issue #59's figures


def engine_terms(out: Path, stdout: str) -> None:
    assert re.search(r"^fit on 4 runs: fixed .* per pool byte", stdout, re.M)
    assert "held out" in stdout and "pool_byte_s:" in stdout


CHECKS: dict[str, Callable[[Path, str], None]] = {f"{f.__name__}.py": f for f in (
    compare_vllm_bench, client_cpu, soak, ray_scaleout, capacity_agreement, capacity_repeat, tools_study,
    noisy_neighbour, verdict_noise, verdict_agreement, verdict_reruns, prediction_errors, engine_terms,
    h100_predictions)}


def half(second: bool) -> list[str]:
    """The scripts named a-o (first) or p-z (second): two test files of about half the time each, since
    make test's first pass runs a file on one of its two workers."""
    return [s for s in scripts() if (s >= "p") == second]
