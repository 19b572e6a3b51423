"""The cost section says so when the priced instance's GPUs are not the ones the speeds were measured on (a
study written for an H200 instance, run on an H100)."""

from __future__ import annotations

from paths import ROOT
from servelab.analysis.cost import study_price
from servelab.report.load import load_study_data
from servelab.report.money import other_gpu


def test_a_price_for_other_gpus_than_the_measured_ones_is_named():
    sd = load_study_data(ROOT / "reports" / "h200-arch-holdout")  # measured on an H100, priced on p5.48xlarge
    price = study_price(sd.study, use_api=False)
    assert other_gpu(sd, price) == ""
    for c in sd.config_ids:
        sd.runs[c]["gpus_used"] = [{"name": "NVIDIA H200"}]
    text = other_gpu(sd, price)
    assert "p5.48xlarge" in text and "NVIDIA H100 80 GB" in text and "measured on NVIDIA H200" in text
    for c in sd.config_ids:
        sd.runs[c]["gpus_used"] = [{"name": "AMD EPYC"}]  # no GPU model to compare: nothing said
    assert other_gpu(sd, price) == ""
