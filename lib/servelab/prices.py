"""Prices: EC2 On-Demand through the AWS Pricing API (cached), a committed fallback table with
source and date for every number, and managed-API token prices.

`ec2_hourly_usd(instance_type, region)` asks the Pricing API (boto3 `pricing` client on its
us-east-1 endpoint, `get_products` with TERM_MATCH filters for Linux, shared tenancy, no
pre-installed software, capacity status Used), parses the OnDemand price dimension, and keeps
the answer in a JSON cache; without the API (dry runs, no credentials) it reads
`data/prices.yaml`. Every `Price` carries its source and date so a report can print them.
`managed_price(key)` returns a managed API's per-1M-token prices (Fireworks, DeepSeek's own API
with its peak/off-peak tiers, Atlas Cloud). Not for arithmetic on throughput (`cost`).
"""

from __future__ import annotations

import difflib
import json
import time
from dataclasses import asdict, dataclass, field
from datetime import date, datetime, timezone
from functools import cache
from pathlib import Path
from typing import Any, Iterable

from . import yamlio

from .errors import ServelabError
from .paths import cache_root

TABLE_PATH = Path(__file__).with_name("data") / "prices.yaml"
SEED001_PATH = TABLE_PATH.with_name("seed001.yaml")  # published g7e.12xlarge figures, with source and date
FIXED_PRICES_PATH = TABLE_PATH.with_name("aws-fixed-prices.yaml")  # quoted AWS list prices beside the instance
PRICING_ENDPOINT_REGION = "us-east-1"  # the Pricing API answers from us-east-1 (also eu-central-1, ap-south-1)
CACHE_FILE = "ec2_prices.json"
DEFAULT_MAX_AGE_DAYS = 30

# Pricing API `location` names, used when a `regionCode` filter finds nothing.
REGION_NAMES = {
    "us-east-1": "US East (N. Virginia)", "us-east-2": "US East (Ohio)", "us-west-1": "US West (N. California)",
    "us-west-2": "US West (Oregon)", "eu-west-1": "EU (Ireland)", "eu-west-2": "EU (London)",
    "eu-west-3": "EU (Paris)", "eu-central-1": "EU (Frankfurt)", "eu-north-1": "EU (Stockholm)",
    "ap-northeast-1": "Asia Pacific (Tokyo)", "ap-northeast-2": "Asia Pacific (Seoul)",
    "ap-northeast-3": "Asia Pacific (Osaka)", "ap-southeast-1": "Asia Pacific (Singapore)",
    "ap-southeast-2": "Asia Pacific (Sydney)", "ap-south-1": "Asia Pacific (Mumbai)",
    "ca-central-1": "Canada (Central)", "sa-east-1": "South America (Sao Paulo)",
}


class PriceError(ServelabError, LookupError):
    """No usable price: the message says what was tried."""


@dataclass(frozen=True)
class Price:
    usd_per_hour: float
    source: str
    as_of: str
    instance_type: str = ""
    region: str = ""
    status: str = ""  # pricing-api | cache | published | third-party | unverified estimate
    note: str | None = None

    def label(self) -> str:
        s = f"${self.usd_per_hour:,.4f}/h ({self.status}; {self.source}; as of {self.as_of})"
        return s + (f"; {self.note}" if self.note else "")


@dataclass(frozen=True)
class ManagedPrice:
    key: str
    provider: str
    model: str
    input_usd_per_m: float
    output_usd_per_m: float
    cache_read_usd_per_m: float | None
    source: str
    as_of: str
    status: str
    tier: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def label(self) -> str:
        cache = f" / cache read {self.cache_read_usd_per_m:.6g}" if self.cache_read_usd_per_m is not None else ""
        return (f"{self.key}: in {self.input_usd_per_m:.6g} / out {self.output_usd_per_m:.6g}{cache} USD per 1M "
                f"({self.status}; {self.source}; as of {self.as_of})")


# -- table -----------------------------------------------------------------------------------
def load_table(path: str | Path | None = None) -> dict[str, Any]:
    return yamlio.safe_load(Path(path or TABLE_PATH).read_text())


@cache
def seed001_table() -> dict[str, Any]:
    """data/seed001.yaml as written (read once; `analysis.cost.seed001_published` hands out copies)."""
    return yamlio.safe_load(SEED001_PATH.read_text(encoding="utf-8"))


def fixed_prices_table() -> dict[str, Any]:
    """data/aws-fixed-prices.yaml as written: per region, each fixed cost's USD with its source and date."""
    return yamlio.safe_load(FIXED_PRICES_PATH.read_text(encoding="utf-8"))


def table_price(instance_type: str, region: str, table: dict[str, Any] | None = None) -> Price:
    """The committed table's price; a us-east-1 entry stands in for another region (said so)."""
    t = table or load_table()
    rows = [r for r in t.get("ec2_on_demand", []) if r["instance_type"] == instance_type]
    exact = [r for r in rows if r["region"] == region]
    note = None
    if exact:
        row = exact[0]
    else:
        stand_in = [r for r in rows if r["region"] == "us-east-1"]
        if not stand_in:
            raise PriceError(f"no price for {instance_type} in the committed table ({TABLE_PATH.name}); "
                             "ask the Pricing API or set cost.hourly_usd")
        row = stand_in[0]
        note = f"us-east-1 price used for {region}: regional prices differ"
    if row.get("usd_per_hour") is None:
        raise PriceError(f"{instance_type}: the committed table has no verified price ({row.get('source')}); "
                         "ask the Pricing API or set cost.hourly_usd")
    return Price(float(row["usd_per_hour"]), " ".join(str(row["source"]).split()), str(row.get("as_of")),
                 instance_type, region, str(row.get("status")), note)


def managed_prices(table: dict[str, Any] | None = None) -> dict[str, ManagedPrice]:
    t = table or load_table()
    out = {}
    for r in t.get("managed_api", []):
        known = {"key", "provider", "model", "input_usd_per_m", "output_usd_per_m", "cache_read_usd_per_m",
                 "source", "as_of", "status", "tier"}
        out[r["key"]] = ManagedPrice(
            key=r["key"], provider=r["provider"], model=r["model"], input_usd_per_m=float(r["input_usd_per_m"]),
            output_usd_per_m=float(r["output_usd_per_m"]),
            cache_read_usd_per_m=None if r.get("cache_read_usd_per_m") is None else float(r["cache_read_usd_per_m"]),
            source=" ".join(str(r["source"]).split()), as_of=str(r["as_of"]), status=str(r["status"]),
            tier=r.get("tier"), extra={k: v for k, v in r.items() if k not in known})
    return out


def managed_price(key: str, table: dict[str, Any] | None = None) -> ManagedPrice:
    prices = managed_prices(table)
    if key not in prices:
        close = difflib.get_close_matches(key, list(prices), n=1)
        raise PriceError(f"no managed API price {key!r}" + (f" (did you mean {close[0]!r}?)" if close else "")
                         + f"; known: {sorted(prices)}")
    return prices[key]


def peak_fraction(schedule: str = "deepseek", table: dict[str, Any] | None = None) -> float:
    """Share of a week's hours in the peak window (DeepSeek: 7 h x 5 weekdays / 168 h)."""
    s = (table or load_table())["peak_schedule"][schedule]
    per_day = sum(b - a for a, b in s["utc_hours"])
    days = 5 if s.get("weekdays_only") else 7
    return per_day * days / (24 * 7)


def blended(peak: ManagedPrice, off_peak: ManagedPrice, fraction_peak: float) -> ManagedPrice:
    """Peak/off-peak prices weighted by the share of tokens sent in the peak window."""
    f = fraction_peak

    def mix(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else f * a + (1 - f) * b

    key = peak.key.split("@")[0] + "@blend"
    return ManagedPrice(key, peak.provider, peak.model, mix(peak.input_usd_per_m, off_peak.input_usd_per_m),
                        mix(peak.output_usd_per_m, off_peak.output_usd_per_m),
                        mix(peak.cache_read_usd_per_m, off_peak.cache_read_usd_per_m),
                        f"{f:.1%} of tokens at peak, the rest off-peak ({peak.source})", peak.as_of,
                        "computed from " + peak.status, tier=f"blend {f:.3f}")


# -- Pricing API -----------------------------------------------------------------------------
def pricing_filters(instance_type: str, region: str, *, by_location: bool = False) -> list[dict[str, str]]:
    where = ({"Type": "TERM_MATCH", "Field": "location", "Value": REGION_NAMES[region]} if by_location
             else {"Type": "TERM_MATCH", "Field": "regionCode", "Value": region})
    return [
        {"Type": "TERM_MATCH", "Field": "instanceType", "Value": instance_type},
        where,
        {"Type": "TERM_MATCH", "Field": "operatingSystem", "Value": "Linux"},
        {"Type": "TERM_MATCH", "Field": "tenancy", "Value": "Shared"},
        {"Type": "TERM_MATCH", "Field": "preInstalledSw", "Value": "NA"},
        {"Type": "TERM_MATCH", "Field": "capacitystatus", "Value": "Used"},
        {"Type": "TERM_MATCH", "Field": "licenseModel", "Value": "No License required"},
    ]


def parse_on_demand(price_list: list[str | dict[str, Any]]) -> tuple[float, str | None]:
    """(USD per hour, publication date) from get_products' PriceList (JSON strings).

    Takes the OnDemand terms' hourly USD dimensions; several products with different prices
    (the filters were too loose) are an error rather than a silent pick.
    """
    found: dict[float, str | None] = {}
    for item in price_list:
        p = json.loads(item) if isinstance(item, str) else item
        for term in (p.get("terms", {}).get("OnDemand") or {}).values():
            for dim in (term.get("priceDimensions") or {}).values():
                usd = dim.get("pricePerUnit", {}).get("USD")
                if usd is None or dim.get("unit", "Hrs") not in ("Hrs", "Hours", "hours"):
                    continue
                v = float(usd)
                if v > 0:
                    found[v] = p.get("publicationDate")
    if not found:
        raise PriceError("the Pricing API answer has no positive OnDemand hourly USD price")
    if len(found) > 1:
        raise PriceError(f"the Pricing API answer has several OnDemand prices {sorted(found)}: filters too loose")
    (v, pub), = found.items()
    return v, pub


def fetch_ec2_price(instance_type: str, region: str, session: Any = None) -> Price:
    """Ask the Pricing API (us-east-1 endpoint). Raises PriceError or a botocore error."""
    import boto3

    sess = session or boto3.Session()
    client = sess.client("pricing", region_name=PRICING_ENDPOINT_REGION)
    for by_location in (False, True):
        if by_location and region not in REGION_NAMES:
            break
        pages = client.get_paginator("get_products").paginate(
            ServiceCode="AmazonEC2", Filters=pricing_filters(instance_type, region, by_location=by_location),
            FormatVersion="aws_v1", PaginationConfig={"PageSize": 100})
        items = [x for page in pages for x in page.get("PriceList", [])]
        if items:
            usd, pub = parse_on_demand(items)
            today = date.today().isoformat()
            return Price(usd, "AWS Pricing API get_products (AmazonEC2, Linux, Shared, On-Demand)",
                         today + (f" (price list published {pub})" if pub else ""), instance_type, region,
                         "pricing-api")
    raise PriceError(f"the Pricing API lists no Linux On-Demand price for {instance_type} in {region}")


def _cache_path(cache_dir: str | Path) -> Path:
    return Path(cache_dir) / CACHE_FILE


def _read_cache(cache_dir: str | Path | None) -> dict[str, Any]:
    if cache_dir is None:
        return {}
    try:
        return json.loads(_cache_path(cache_dir).read_text())
    except (OSError, ValueError):
        return {}


def _write_cache(cache_dir: str | Path | None, key: str, price: Price) -> None:
    if cache_dir is None:
        return
    data = _read_cache(cache_dir)
    data[key] = {**asdict(price), "fetched_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                 "fetched_epoch": time.time()}
    p = _cache_path(cache_dir)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    tmp.replace(p)


def default_cache_dir() -> Path:
    return cache_root() / "prices"


def ec2_hourly_usd(instance_type: str, region: str, *, cache_dir: str | Path | None = None, use_api: bool = True,
                   session: Any = None, max_age_days: float = DEFAULT_MAX_AGE_DAYS,
                   table: dict[str, Any] | None = None) -> Price:
    """EC2 Linux On-Demand USD/hour: fresh cache, else the Pricing API, else the committed table.

    The returned Price says which one answered (status, source, as_of); `note` records why
    the API was not used when the table answered.
    """
    key = f"{region}/{instance_type}"
    cached = _read_cache(cache_dir).get(key)
    if cached and time.time() - float(cached.get("fetched_epoch", 0)) <= max_age_days * 86400:
        return Price(float(cached["usd_per_hour"]), cached["source"], cached["as_of"], instance_type, region,
                     "cache", f"cached {cached.get('fetched_at')} in {_cache_path(cache_dir)}")  # type: ignore[arg-type]
    why = None
    if use_api:
        try:
            price = fetch_ec2_price(instance_type, region, session)
            _write_cache(cache_dir, key, price)
            return price
        except Exception as e:  # noqa: BLE001 - any failure falls back to the table, and says so
            why = f"Pricing API unavailable: {type(e).__name__}: {str(e)[:160]}"
    p = table_price(instance_type, region, table)
    note = "; ".join(x for x in (p.note, why) if x) or None
    return Price(p.usd_per_hour, p.source, p.as_of, p.instance_type, p.region, p.status, note)


def resolve_managed(keys: Iterable[str], table: dict[str, Any] | None = None) -> dict[str, ManagedPrice]:
    """Price objects for keys; `provider/model@blend` mixes its @peak/@off-peak by peak hours."""
    t = table or load_table()
    out: dict[str, ManagedPrice] = {}
    for k in keys:
        if k.endswith("@blend"):
            base = k[: -len("@blend")]
            peak, off = managed_price(base + "@peak", t), managed_price(base + "@off-peak", t)
            schedule = base.split("/")[0]
            out[k] = blended(peak, off, peak_fraction(schedule, t))
        else:
            out[k] = managed_price(k, t)
    return out
