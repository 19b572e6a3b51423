"""`servelab predict --model --compare-gpus` (servelab.advise, issue #59): every GPU of the hardware table and
every lever the model can cost, ranked by predicted cost per million output tokens at the SLO at the committed
prices; the params files that would confirm the top choices validate and say their predicted wall time."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys

import pytest
from paths import ROOT

from servelab import advise
from servelab.models.facts import facts_from_config
from servelab.schema import load_study


def _facts(name: str) -> dict:
    return facts_from_config(json.loads((ROOT / "tests" / "fixtures" / "architectures" / f"{name}.json").read_text()))


def test_every_gpu_and_lever_is_ranked_by_cost_per_million_output_tokens():
    slo = {"ttft_p95_s": 1.0, "tpot_p95_s": 0.05}
    ch = advise.compare(_facts("llama-3.1-8b"), input_tokens=256, output_tokens=256, slo=slo)
    gpus = {c.gpu for c in ch}
    assert gpus == {"H200 SXM", "H100 SXM", "RTX PRO 6000 Blackwell Server Edition", "L40S"}
    priced = [c for c in ch if c.usd_per_m_output == c.usd_per_m_output]
    # estimates first, then bounds (at best: a cheaper bound is no reason to rent), each by cost
    kinds = [c.kind for c in priced]
    assert kinds == sorted(kinds, key=lambda k: k != "estimate") and "estimate" in kinds and "bound" in kinds
    for kind in ("estimate", "bound"):
        same = [c for c in priced if c.kind == kind]
        assert all(a.usd_per_m_output <= b.usd_per_m_output for a, b in zip(same, same[1:]))
    assert all(math.isnan(c.usd_per_m_output) for c in ch[len(priced):])  # no price (L40S) or no capacity: last
    top = priced[0]
    # the arithmetic: a GPU-hour's price over the output tokens of an hour at the capacity
    assert top.usd_per_m_output == pytest.approx(top.usd_per_gpu_hour * top.tp / (top.capacity_rps * 256 * 3600) * 1e6)
    assert top.tpot_s <= 0.05 and top.kind in ("estimate", "bound")
    # every lever value was costed: ranked, or said to change nothing the model sees at the SLO (at the capacity a
    # step of requests and a riding prefill outgrows the captured graphs, so eager mode predicts the same there)
    seen = {f"{k}={v}" for c in ch for k, v in c.flags.items()} | {x for c in ch for x in c.no_effect}
    assert {"enforce-eager=True", "kv-cache-dtype=fp8", "max-num-batched-tokens=2048"} <= seen
    assert all(len(c.no_effect) == len(set(c.no_effect)) for c in ch)
    assert set(advise.levers()) <= set(advise.COSTED)


def test_the_confirming_study_validates_and_says_its_wall_time(tmp_path):
    r = subprocess.run([sys.executable, "-m", "servelab.cli", "predict", "--model",
                        "tests/fixtures/architectures/olmoe-1b-7b-0924.json", "--compare-gpus", "--top", "5",
                        "--write-studies", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert re.search(r"^\s+1\s+\S", r.stdout, re.M) and "$/M out" in r.stdout
    m = re.search(r"confirm on (.+?): (\S+\.yaml) \((\d) configurations; predicted (\d+) min on (\d) GPU\(s\), about "
                  r"\$([\d.,]+)", r.stdout)
    assert m, r.stdout
    study = load_study(m.group(2))
    assert study.host.kind == "local" and len(study.configurations) == int(m.group(3))
    assert "device" not in open(m.group(2)).read()  # no device block: placement is left to its default
    assert float(m.group(4)) > 0 and float(m.group(6).replace(",", "")) > 0


def test_no_set_up_is_ranked_past_the_engines_own_limit_on_running_requests():
    """vLLM runs at most max-num-seqs requests at once, 1,024 by default on a GPU of 70 GiB or more and 256 below
    (vllm/engine/arg_utils.py, get_batch_defaults): no row's concurrency passes it, however much KV cache two GPUs
    hold (a Mistral-NeMo-12B TP=2 bound on two H100s was ranked at 1,553 requests before)."""
    from servelab import engines

    prof = engines.get("vllm")
    assert prof.default_max_running(80e9) == 1024 and prof.default_max_running(48e9) == 256
    slo = {"ttft_p95_s": 1.0, "tpot_p95_s": 0.05}
    ch = advise.compare(_facts("llama-3.1-8b"), input_tokens=256, output_tokens=256, slo=slo)
    assert max(c.concurrency for c in ch) > 256 and all(c.concurrency <= 1024 for c in ch)
    assert all(c.concurrency <= 256 for c in ch if c.gpu == "L40S")  # 48 GB
