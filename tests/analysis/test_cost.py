"""Cost model against hand arithmetic: seed 001's published numbers (g7e.12xlarge, 8,887 USD a
month, 104 / 297 / 358.4 tok/s, Fireworks 0.22 / 0.66) and the default study's measured summary."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from pydantic import ValidationError

from servelab.analysis import cost
from servelab.prices import managed_price
from paths import ROOT

SECONDS_PER_MONTH = 3600 * 730  # 2,628,000


def test_unit_arithmetic():
    # $ per 1M output tokens: 8887 USD / (297 tok/s x 3600 s x 730 h / 1e6) = 11.386...
    hourly = 8887 / 730
    assert cost.usd_per_million_tokens(hourly, 297) == pytest.approx(8887 / (297 * 3600 * 730 / 1e6))
    assert cost.usd_per_million_tokens(hourly, 297) == pytest.approx(11.3861, abs=1e-4)
    assert cost.monthly_tokens(297) == 297 * 2_628_000 == 780_516_000
    assert cost.monthly_tokens(297, hours=730, utilization=0.25) == 780_516_000 / 4
    assert cost.monthly_cost(8.2861) == pytest.approx(6048.853)
    assert cost.monthly_cost(8.2861, utilization=0.5, always_on=False) == pytest.approx(6048.853 / 2)
    assert cost.monthly_cost(8.2861, utilization=0.5) == pytest.approx(6048.853)  # always on: all hours billed
    assert cost.monthly_cost(10.0, fixed_monthly_usd=100.0) == 7400.0
    assert math.isnan(cost.usd_per_million_tokens(10.0, 0))


def test_seed001_cost_table_against_hand_arithmetic():
    pub = cost.seed001_published()
    assert (pub["monthly_usd"], pub["fireworks"]) == (8887.0, {"input_usd_per_m": 0.22, "output_usd_per_m": 0.66})
    fw = managed_price("fireworks/deepseek-v4-flash")
    assert (fw.input_usd_per_m, fw.output_usd_per_m) == (0.22, 0.66)  # the table agrees with the seed
    t = cost.cost_table(cost.seed001_summary(), 8887 / 730, ["fireworks/deepseek-v4-flash"])
    assert len(t) == 4
    row = t[(t.config == "cuda-graph") & (t.concurrency == 4)].iloc[0]
    out_m = 297.09 * 3600 * 730 / 1e6  # 780.75 M output tokens a month
    in_m = out_m * 254 / 256  # the 256-token bucket measured 254 prompt tokens
    assert row.monthly_output_m_tokens == pytest.approx(out_m)
    assert row.usd_per_m_output == pytest.approx(8887 / out_m)  # 11.38 USD
    assert row.usd_per_m_input == pytest.approx(8887 / in_m)
    assert row.selfhost_monthly_usd == pytest.approx(8887)
    assert row.managed_monthly_usd == pytest.approx(in_m * 0.22 + out_m * 0.66)  # 685.7 USD
    assert row.selfhost_to_managed == pytest.approx(8887 / (in_m * 0.22 + out_m * 0.66))  # ~12.96x
    # break-even: output tokens a month at which Fireworks costs 8,887 USD
    per_m_out = 0.66 + 0.22 * 254 / 256
    assert row.managed_usd_per_m_output == pytest.approx(per_m_out)
    assert row.break_even_output_m_tokens == pytest.approx(8887 / per_m_out)  # ~10,119 M
    assert row.break_even_utilization == pytest.approx((8887 / per_m_out) / out_m)  # ~13x: unreachable
    # cost per successful request: one hour's cost / requests finished in an hour
    assert row.selfhost_usd_per_request == pytest.approx((8887 / 730) / (297.09 / 256 * 3600))
    assert row.managed_usd_per_request == pytest.approx((254 * 0.22 + 256 * 0.66) / 1e6)
    # the seed's upper ratio: MTP at concurrency 4 (358.4 tok/s) -> "約10.7倍"
    mtp = t[(t.config == "mtp1") & (t.concurrency == 4)].iloc[0]
    out_m = 358.4 * 2_628_000 / 1e6
    assert mtp.selfhost_to_managed == pytest.approx(8887 / (out_m * 254 / 256 * 0.22 + out_m * 0.66))
    assert round(mtp.selfhost_to_managed, 1) == pub["ratio_range"][1] == 10.7


def test_seed001_published_concurrency_one():
    # 104 tok/s at concurrency 1 (CUDA graph, short Japanese prompt)
    lv = next(lv for lv in cost.seed001_published()["levels"] if lv["bucket"] == "short-ja")
    assert (lv["concurrency"], lv["aggregate_output_tps"]) == (1, 104.0)
    assert cost.usd_per_million_tokens(8887 / 730, 104.0) == pytest.approx(8887 / (104 * 3600 * 730 / 1e6))
    assert cost.usd_per_million_tokens(8887 / 730, 104.0) == pytest.approx(32.516, abs=1e-3)


def test_fixed_costs_utilization_and_several_managed_apis():
    s = pd.DataFrame([{"config": "a", "bucket": "b", "concurrency": 2, "prompt_tokens": 1000.0,
                       "output_tokens_p50": 100.0, "aggregate_output_tps": 50.0, "success_rate": 1.0}])
    t = cost.cost_table(s, 2.0, ["atlas/deepseek-v4.1-flash", "deepseek/deepseek-flash@blend"],
                        utilization=0.5, fixed_monthly_usd=146.0)
    assert list(t.managed) == ["atlas/deepseek-v4.1-flash", "deepseek/deepseek-flash@blend"]
    a = t.iloc[0]
    assert a.selfhost_monthly_usd == 2.0 * 730 + 146.0  # 1,606
    assert a.all_in_hourly_usd == pytest.approx(1606 / 730)  # 2.2 USD/h
    assert a.usd_per_m_output == pytest.approx(2.2 / (50 * 3600) * 1e6)
    out_m = 50 * 3600 * 730 * 0.5 / 1e6  # 65.7 M at half utilization
    assert a.monthly_output_m_tokens == pytest.approx(out_m)
    assert a.managed_monthly_usd == pytest.approx(out_m * 10 * 0.30 + out_m * 1.20)
    blend = t.iloc[1]
    f = 35 / 168
    assert blend.managed_usd_per_m_output == pytest.approx(10 * (f * 0.30 + (1 - f) * 0.15) + (f * 1.2 + (1 - f) * 0.6))
    cached = cost.cost_table(s, 2.0, ["atlas/deepseek-v4.1-flash"], cached_input_fraction=0.5).iloc[0]
    assert cached.managed_usd_per_m_output == pytest.approx(5 * 0.30 + 5 * 0.03 + 1.20)
    plain = cost.cost_table(s, 2.0)
    assert len(plain) == 1 and plain.iloc[0].managed is None


def test_default_study_cost_table_from_its_measured_summary():
    from servelab.runfolder import load_records
    from servelab.summary import summarize

    data = ROOT / "reports" / "local-cpu-kv" / "data"
    dirs = sorted(p for p in data.iterdir() if (p / "records.jsonl").exists())
    summary = summarize(load_records(dirs))
    assert len(summary) > 0
    # the default study runs on this CPU machine: an illustrative price of 1 USD/h, stated
    t = cost.cost_table(summary, 1.0, ["fireworks/deepseek-v4-flash"])
    assert len(t) == len(summary)
    for (_, row), (_, lv) in zip(t.iterrows(), summary.iterrows()):
        agg = lv.aggregate_output_tps
        assert row.usd_per_m_output == pytest.approx(1.0 / (agg * 3600) * 1e6)
        out_m = agg * 3600 * 730 / 1e6
        in_m = out_m * lv.prompt_tokens / lv.output_tokens_p50
        assert row.managed_monthly_usd == pytest.approx(in_m * 0.22 + out_m * 0.66)
        assert row.selfhost_to_managed == pytest.approx(730.0 / (in_m * 0.22 + out_m * 0.66))
        assert row.selfhost_usd_per_request == pytest.approx(1.0 / 3600 / (agg / lv.output_tokens_p50))


def test_replay_cost_table_prices_the_measured_tokens():
    s = pd.DataFrame([{"config": "fireworks", "bucket": "in256-out256", "concurrency": 4, "ok": 20,
                       "prompt_tokens": 254.0, "output_tokens_p50": 256.0, "aggregate_output_tps": 80.0}])
    r = cost.replay_cost_table(s, managed_price("fireworks/deepseek-v4-flash")).iloc[0]
    assert r.input_tokens == 20 * 254 and r.output_tokens == 20 * 256
    assert r.usd == pytest.approx((20 * 254 * 0.22 + 20 * 256 * 0.66) / 1e6)
    assert r.usd_per_request == pytest.approx((254 * 0.22 + 256 * 0.66) / 1e6)


def test_cost_params_validate_price_keys():
    p = cost.CostParams(managed=["fireworks/deepseek-v4-flash", "deepseek/deepseek-flash@blend"])
    assert p.hours_per_month == 730 and p.utilization == 1.0
    with pytest.raises(ValidationError, match="did you mean 'atlas/deepseek-v4.1-flash'"):
        cost.CostParams(managed=["atlas/deepseek-v41-flash"])
    with pytest.raises(ValidationError):
        cost.CostParams(utilization=1.5)
    with pytest.raises(ValidationError):
        cost.CostParams(hourly=3)  # unknown key


def test_estimate_lines_for_the_default_study():
    from servelab.schema import load_study

    s = load_study(ROOT / "params" / "local-cpu-kv.yaml")
    assert cost.cost_estimate_lines(s) == [
        "cost: local host, no cloud spend (add a cost: block to price the measured throughput)"]


def test_seed001_month_itemised_and_the_gap_named():
    m = cost.seed001_monthly("us-east-1")
    got = [(label.split(" (")[0].split(":")[0], round(usd, 3)) for label, usd, _, _ in m["items"]]
    assert got == [("g7e.12xlarge On-Demand", 6048.853),  # 8.2861 x 730
                   ("NAT gateway x 1", 32.85),            # 0.045 x 730
                   ("public IPv4 of the NAT's Elastic IP", 3.65),  # 0.005 x 730
                   ("internal ALB", 16.425),              # 0.0225 x 730
                   ("ALB LCU", 5.84),                     # 0.008 x 730
                   ("gp3 root EBS 300 GiB", 24.0),        # 0.08 x 300
                   ("NAT data processed", 0.0)]           # the seed gives no volume
    assert m["itemised_usd"] == pytest.approx(6131.618)
    assert m["not_itemised_usd"] == pytest.approx(8887 - 6131.618) == pytest.approx(2755.382)
    for label, _, basis, source in m["items"][1:]:  # every fixed cost dated and sourced, status quoted
        assert "https://aws.amazon.com/" in source and ", as of 20" in source and source.endswith(", quoted"), label
    lines = cost.seed001_cost_lines()
    assert "cost:   itemised $6,131.62; not itemised by the seed: $2,755.38 (31.0% of its $8,887.00)" in lines
    assert lines[0].startswith("cost: seed 001's month, itemised at us-east-1 list prices (published: $8,887.00 = ")


def test_every_ratio_comes_with_the_seed_figure():
    pub = cost.seed001_published()
    assert pub["ratio_range"] == (2.2, 10.7) and "2.2倍から10.7倍" in pub["ratio_quote"]
    assert cost.vs_published(12.9607, pub["ratio_range"]) == "12.96x (seed 001 published: 2.2-10.7x)"
    assert cost.vs_published(104.0, 104.0, unit=" tok/s", digits=1) == "104.0 tok/s (seed 001 published: 104 tok/s)"
    ratio_lines = [ln for ln in cost.seed001_cost_lines() if "x (" in ln]
    assert len(ratio_lines) == 2
    for ln in ratio_lines:  # each ratio printed has the published range beside it
        assert ln.count("x (seed 001 published: 2.2-10.7x)") == 2
    assert "12.96x (seed 001 published: 2.2-10.7x)" in ratio_lines[0]
    assert "10.74x (seed 001 published: 2.2-10.7x)" in ratio_lines[1]
    # at the itemised month: 6,131.62 / Fireworks at 297.09 and 358.4 tok/s
    fw = lambda tps: tps * 2_628_000 / 1e6 * (254 / 256 * 0.22 + 0.66)
    assert f"{6131.618 / fw(297.09):.2f}x" == "8.94x" and "at the itemised $6,131.62 8.94x" in ratio_lines[0]
    assert f"{6131.618 / fw(358.4):.2f}x" == "7.41x" and "at the itemised $6,131.62 7.41x" in ratio_lines[1]
