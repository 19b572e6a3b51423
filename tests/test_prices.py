"""Prices: Pricing API parsing (a recorded get_products answer), the cache, the committed
fallback table, managed-API prices with peak/off-peak tiers."""

from __future__ import annotations

import json
import time

import boto3
import pytest
from botocore.exceptions import NoCredentialsError
from botocore.stub import Stubber

from servelab import prices

# One PriceList entry as get_products returns it (a JSON string), trimmed to what matters:
# the OnDemand term with its hourly dimension, plus a Reserved term that must be ignored.
PRODUCT = {
    "product": {
        "productFamily": "Compute Instance",
        "attributes": {
            "instanceType": "g7e.12xlarge", "regionCode": "eu-west-2", "location": "EU (London)",
            "operatingSystem": "Linux", "tenancy": "Shared", "preInstalledSw": "NA", "capacitystatus": "Used",
            "licenseModel": "No License required", "gpu": "2", "vcpu": "48", "servicecode": "AmazonEC2",
        },
        "sku": "ABCDEF1234567890",
    },
    "serviceCode": "AmazonEC2",
    "terms": {
        "OnDemand": {
            "ABCDEF1234567890.JRTCKXETXF": {
                "priceDimensions": {
                    "ABCDEF1234567890.JRTCKXETXF.6YS6EN2CT7": {
                        "unit": "Hrs", "endRange": "Inf", "beginRange": "0",
                        "description": "$9.1234 per On Demand Linux g7e.12xlarge Instance Hour",
                        "rateCode": "ABCDEF1234567890.JRTCKXETXF.6YS6EN2CT7", "appliesTo": [],
                        "pricePerUnit": {"USD": "9.1234000000"},
                    }
                },
                "sku": "ABCDEF1234567890", "effectiveDate": "2026-10-01T00:00:00Z",
                "offerTermCode": "JRTCKXETXF", "termAttributes": {},
            }
        },
        "Reserved": {
            "ABCDEF1234567890.4NA7Y494T4": {
                "priceDimensions": {
                    "x": {"unit": "Hrs", "pricePerUnit": {"USD": "5.0000000000"}, "description": "1yr RI"}},
            }
        },
    },
    "version": "20261015000000",
    "publicationDate": "2026-10-15T00:00:00Z",
}


class FakeSession:
    """A boto3-like session whose pricing client is stubbed (or raises)."""

    def __init__(self, client=None, error: Exception | None = None):
        self._client, self._error, self.calls = client, error, []

    def client(self, name, region_name=None):
        self.calls.append((name, region_name))
        if self._error:
            raise self._error
        return self._client


def stubbed(responses: list[tuple[dict, dict]]):
    c = boto3.client("pricing", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="y")
    st = Stubber(c)
    for resp, expected in responses:
        st.add_response("get_products", resp, expected)
    st.activate()
    return c, st


def expected_params(instance_type: str, region: str, by_location: bool = False) -> dict:
    return {"ServiceCode": "AmazonEC2", "Filters": prices.pricing_filters(instance_type, region, by_location=by_location),
            "FormatVersion": "aws_v1", "MaxResults": 100}


def test_filters_are_the_documented_term_matches():
    f = {x["Field"]: x["Value"] for x in prices.pricing_filters("g7e.12xlarge", "eu-west-2")}
    assert f == {"instanceType": "g7e.12xlarge", "regionCode": "eu-west-2", "operatingSystem": "Linux",
                 "tenancy": "Shared", "preInstalledSw": "NA", "capacitystatus": "Used",
                 "licenseModel": "No License required"}
    assert all(x["Type"] == "TERM_MATCH" for x in prices.pricing_filters("g7e.12xlarge", "eu-west-2"))
    loc = {x["Field"]: x["Value"] for x in prices.pricing_filters("g7e.12xlarge", "eu-west-2", by_location=True)}
    assert loc["location"] == "EU (London)" and "regionCode" not in loc


def test_parse_on_demand_from_a_recorded_answer():
    usd, pub = prices.parse_on_demand([json.dumps(PRODUCT)])
    assert usd == 9.1234 and pub == "2026-10-15T00:00:00Z"  # the Reserved 5.0 is ignored
    two = json.loads(json.dumps(PRODUCT))
    dim = two["terms"]["OnDemand"]["ABCDEF1234567890.JRTCKXETXF"]["priceDimensions"]
    next(iter(dim.values()))["pricePerUnit"]["USD"] = "7.0"
    with pytest.raises(prices.PriceError, match="several OnDemand prices"):
        prices.parse_on_demand([json.dumps(PRODUCT), json.dumps(two)])
    with pytest.raises(prices.PriceError, match="no positive"):
        prices.parse_on_demand([])


def test_pricing_api_call_uses_us_east_1_and_falls_back_to_location():
    c, st = stubbed([({"PriceList": [], "FormatVersion": "aws_v1"}, expected_params("g7e.12xlarge", "eu-west-2")),
                     ({"PriceList": [json.dumps(PRODUCT)], "FormatVersion": "aws_v1"},
                      expected_params("g7e.12xlarge", "eu-west-2", by_location=True))])
    sess = FakeSession(c)
    p = prices.fetch_ec2_price("g7e.12xlarge", "eu-west-2", session=sess)
    st.assert_no_pending_responses()
    assert sess.calls == [("pricing", "us-east-1")]
    assert p.usd_per_hour == 9.1234 and p.status == "pricing-api" and "2026-10-15" in p.as_of


def test_pricing_api_pages_through_next_token():
    first = expected_params("g7e.12xlarge", "eu-west-2")
    second = {**first, "NextToken": "t1"}
    c, st = stubbed([({"PriceList": [], "NextToken": "t1", "FormatVersion": "aws_v1"}, first),
                     ({"PriceList": [json.dumps(PRODUCT)], "FormatVersion": "aws_v1"}, second)])
    assert prices.fetch_ec2_price("g7e.12xlarge", "eu-west-2", session=FakeSession(c)).usd_per_hour == 9.1234
    st.assert_no_pending_responses()


def test_cache_then_fallback(tmp_path):
    c, _ = stubbed([({"PriceList": [json.dumps(PRODUCT)], "FormatVersion": "aws_v1"},
                     expected_params("g7e.12xlarge", "eu-west-2"))])
    p1 = prices.ec2_hourly_usd("g7e.12xlarge", "eu-west-2", cache_dir=tmp_path, session=FakeSession(c))
    assert p1.status == "pricing-api" and (tmp_path / prices.CACHE_FILE).exists()
    # the API is gone now: the cache answers
    p2 = prices.ec2_hourly_usd("g7e.12xlarge", "eu-west-2", cache_dir=tmp_path,
                               session=FakeSession(error=NoCredentialsError()))
    assert (p2.usd_per_hour, p2.status) == (9.1234, "cache") and "cached" in p2.note
    # a stale cache is not used; without the API the committed table answers and says why
    data = json.loads((tmp_path / prices.CACHE_FILE).read_text())
    data["eu-west-2/g7e.12xlarge"]["fetched_epoch"] = time.time() - 40 * 86400
    (tmp_path / prices.CACHE_FILE).write_text(json.dumps(data))
    p3 = prices.ec2_hourly_usd("g7e.12xlarge", "eu-west-2", cache_dir=tmp_path,
                               session=FakeSession(error=NoCredentialsError()))
    assert p3.usd_per_hour == 8.2861 and p3.status == "unverified estimate"
    assert "us-east-1 price used for eu-west-2" in p3.note and "Pricing API unavailable: NoCredentialsError" in p3.note


def test_table_without_api():
    p = prices.ec2_hourly_usd("g7e.12xlarge", "us-east-1", use_api=False)
    assert p.usd_per_hour == 8.2861 and p.note is None and p.as_of == "2026-08"
    assert prices.ec2_hourly_usd("p5en.48xlarge", "us-east-1", use_api=False).usd_per_hour / 8 == pytest.approx(7.912)
    with pytest.raises(prices.PriceError, match="no verified price"):
        prices.ec2_hourly_usd("g7e.4xlarge", "us-east-1", use_api=False)  # unknown: never invented
    with pytest.raises(prices.PriceError, match="no price for m7i.large"):
        prices.ec2_hourly_usd("m7i.large", "us-east-1", use_api=False)


def test_every_committed_price_states_source_date_and_status():
    t = prices.load_table()
    statuses = {"published", "third-party", "unverified estimate", "unknown"}
    types = {r["instance_type"] for r in t["ec2_on_demand"]}
    assert {"g7e.2xlarge", "g7e.4xlarge", "g7e.8xlarge", "g7e.12xlarge", "g7e.24xlarge", "g7e.48xlarge",
            "p5.48xlarge", "p5en.48xlarge"} <= types
    for r in t["ec2_on_demand"] + t["managed_api"] + t["fixed_costs"]:
        assert r["status"] in statuses and r["source"]
        assert ("as_of" in r) and (r["as_of"] is not None or r["status"] == "unknown")
        if r["status"] == "unknown":
            assert r.get("usd_per_hour") is None


def test_managed_prices_and_tiers():
    m = prices.managed_prices()
    fw = m["fireworks/deepseek-v4-flash"]
    assert (fw.input_usd_per_m, fw.output_usd_per_m) == (0.22, 0.66)  # seed 001
    atlas = m["atlas/deepseek-v4.1-flash"]
    assert (atlas.input_usd_per_m, atlas.output_usd_per_m, atlas.cache_read_usd_per_m) == (0.30, 1.20, 0.03)
    assert atlas.as_of == "2026-10"  # seed 002
    peak, off = m["deepseek/deepseek-flash@peak"], m["deepseek/deepseek-flash@off-peak"]
    assert peak.output_usd_per_m == 2 * off.output_usd_per_m and peak.input_usd_per_m == 2 * off.input_usd_per_m
    f = prices.peak_fraction("deepseek")
    assert f == pytest.approx(7 * 5 / 168)  # 01-04 and 06-10 UTC on weekdays
    b = prices.blended(peak, off, f)
    assert b.output_usd_per_m == pytest.approx(f * 1.20 + (1 - f) * 0.60)
    assert b.key == "deepseek/deepseek-flash@blend"
    with pytest.raises(prices.PriceError, match="did you mean 'fireworks/deepseek-v4-flash'"):
        prices.managed_price("fireworks/deepseek-v4-flsh")
