"""`servelab explain`: a study without surprises says so and runs nothing; with --dry-run the
planned sweeps are printed (the committed h200-moe study's SGLang fp8 KV cache)."""

from __future__ import annotations

import subprocess
import sys

from paths import ROOT


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "servelab.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def test_no_surprise_runs_nothing():
    r = _cli("explain", "local-cpu-kv", "kv-tight")
    assert r.returncode == 0 and "no surprise" in r.stdout and "nothing run" in r.stdout
    assert not (ROOT / "runs" / ".explain" / "local-cpu-kv-explain-kv-tight.yaml").exists()


def test_dry_run_prints_the_sweeps_of_the_sglang_fp8_surprise():
    r = _cli("explain", "h200-moe", "sglang-fp8kv", "--dry-run")
    assert r.returncode == 0, r.stderr
    sweeps = [ln for ln in r.stdout.splitlines() if ln.startswith("sweep ")]
    assert [s.split()[1] for s in sweeps] == ["max-total-tokens", "attention-backend", "page-size",
                                             "disable-cuda-graph"]
    assert any(ln.startswith("try attention-backend flashmla, page-size 64") for ln in r.stdout.splitlines())
    # the surprising configuration's own value (552000) and the engine's defaults (fa3, pages of 1, graphs on)
    # are not run again beside it: it is the reference
    assert ("8 configurations: sglang-fp8kv, sglang-fp8kv-max-total-tokens-69000, sglang-fp8kv-max-total-tokens-138000, "
            "sglang-fp8kv-attention-backend-flashmla, sglang-fp8kv-attention-backend-triton, sglang-fp8kv-page-size-64, "
            "sglang-fp8kv-disable-cuda-graph-true, sglang-fp8kv-fix-1") in r.stdout
    assert not (ROOT / "runs" / ".explain" / "h200-moe-explain-sglang-fp8kv.yaml").exists()


def test_the_followups_option_plans_one_followup_per_surprising_configuration(capsys):
    """`followups:` in a study runs `servelab explain` for each surprise after the report (dry run here)."""
    from servelab.explain import run_followups

    assert run_followups("h200-moe", budget_s=600, max_studies=2, dry_run=True) == 0
    out = capsys.readouterr().out
    assert "sweep max-total-tokens over [69000, 138000, 552000] around sglang-fp8kv" in out
    assert run_followups("local-cpu-kv", budget_s=600, max_studies=2, dry_run=True) == 0
    assert not (ROOT / "runs" / ".explain" / "h200-moe-explain-sglang-fp8kv.yaml").exists()
