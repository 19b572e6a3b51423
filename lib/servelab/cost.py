"""Cost model: self-hosted GPU hours against managed per-token APIs, on plain numbers.

Definitions (a report prints them):
- USD per 1M output tokens = hourly USD / (aggregate output tok/s x 3600) x 1e6: the whole
  instance-hour charged to the output tokens produced at the measured aggregate throughput
  (the input-token figure charges the same hour to the input tokens instead).
- Monthly tokens = tok/s x 3600 x hours x utilization (hours = 730 by default).
- Monthly self-host cost = hourly USD x hours (always on; x utilization when the host is only
  up while busy) + optional fixed costs (NAT gateway, ALB, storage).
- Managed monthly cost for the same volume = input tokens x input price + output tokens x
  output price (+ cache reads), input tokens = output tokens x measured prompt/output ratio.
- Break-even = monthly output tokens at which both cost the same; as a utilization of the
  measured throughput it says whether the instance could ever get there.
- Cost per successful request = hourly USD / 3600 / successful requests per second.
Seed 001 compares this way: 4-way aggregate tok/s held for 730 h, input at the bucket's
prompt/output ratio, AWS 8,887 USD/month all-in vs Fireworks 0.22 / 0.66 USD per 1M.
The write-up's cost section is computed here from measured summaries, never typed in.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, field_validator

from .prices import ManagedPrice, PriceError, blended, load_table, managed_price, managed_prices, peak_fraction

HOURS_PER_MONTH = 730.0


class CostParams(BaseModel):
    """`cost:` block of a study (proposed for config.Study)."""

    model_config = ConfigDict(extra="forbid")
    hourly_usd: float | None = Field(None, gt=0, description="instance USD/hour; default: Pricing API or the "
                                     "committed table for host.aws.instance_type in the region used")
    instance_type: str | None = Field(None, description="instance the cost rows assume (default host.aws.instance_type)")
    region: str | None = Field(None, description="region of the price (default the first of host.aws.regions)")
    gpus_used: int | None = Field(None, gt=0, description="charge only this many of the instance's GPUs "
                                  "(per-GPU share of the instance price, e.g. one H200 of a p5en.48xlarge)")
    hours_per_month: float = Field(HOURS_PER_MONTH, gt=0, description="billed hours per month")
    utilization: float = Field(1.0, gt=0, le=1, description="share of the month at the measured throughput")
    always_on: bool = Field(True, description="bill every hour (true) or only busy hours (false)")
    fixed_monthly_usd: dict[str, float] = Field(default_factory=dict,
                                                description="named fixed costs per month, e.g. nat_gateway: 45")
    managed: list[str] = Field(default_factory=list, description="managed API price keys from prices.yaml "
                               "(key@blend mixes a peak/off-peak pair by the provider's peak hours)")
    replay_price: str | None = Field(None, description="price key of the managed endpoint a host.kind attach "
                                     "study replays (cost of the measured tokens)")
    cached_input_fraction: float = Field(0.0, ge=0, le=1, description="share of input billed as cache reads")
    assumed_decode_tps: float | None = Field(None, gt=0, description="per-request decode tok/s for the dry-run "
                                             "time estimate (unknown until measured)")
    startup_estimate_min: float = Field(20.0, ge=0, description="dry-run estimate: first start incl. model download")
    switch_estimate_min: float = Field(10.0, ge=0, description="dry-run estimate: restart per configuration")

    @field_validator("managed")
    @classmethod
    def _known(cls, keys: list[str]) -> list[str]:
        for k in keys:
            try:
                resolve_managed([k])
            except PriceError as e:
                raise ValueError(str(e)) from None
        return keys

    @field_validator("replay_price")
    @classmethod
    def _known_replay(cls, key: str | None) -> str | None:
        if key is not None:
            try:
                resolve_managed([key])
            except PriceError as e:
                raise ValueError(str(e)) from None
        return key


# -- arithmetic ------------------------------------------------------------------------------
def usd_per_million_tokens(hourly_usd: float, tokens_per_s: float) -> float:
    """Hourly cost spread over the tokens one hour produces at `tokens_per_s`."""
    if tokens_per_s <= 0 or not math.isfinite(tokens_per_s):
        return float("nan")
    return hourly_usd / (tokens_per_s * 3600.0) * 1e6


def monthly_tokens(tokens_per_s: float, hours: float = HOURS_PER_MONTH, utilization: float = 1.0) -> float:
    return tokens_per_s * 3600.0 * hours * utilization


def monthly_cost(hourly_usd: float, hours: float = HOURS_PER_MONTH, utilization: float = 1.0,
                 fixed_monthly_usd: float = 0.0, always_on: bool = True) -> float:
    """Instance hours (all `hours` when always on, else only busy hours) plus fixed costs."""
    billed = hours if always_on else hours * utilization
    return hourly_usd * billed + fixed_monthly_usd


def managed_cost(input_tokens: float, output_tokens: float, price: ManagedPrice,
                 cached_input_fraction: float = 0.0) -> float:
    """USD a managed API charges for these tokens (cache reads at the cache price)."""
    cached = input_tokens * cached_input_fraction if price.cache_read_usd_per_m is not None else 0.0
    return ((input_tokens - cached) * price.input_usd_per_m + cached * (price.cache_read_usd_per_m or 0.0)
            + output_tokens * price.output_usd_per_m) / 1e6


def managed_usd_per_million_output(price: ManagedPrice, input_per_output: float,
                                   cached_input_fraction: float = 0.0) -> float:
    """Managed USD per 1M output tokens including the input that comes with them."""
    return managed_cost(input_per_output * 1e6, 1e6, price, cached_input_fraction)


def break_even(selfhost_monthly_usd: float, price: ManagedPrice, input_per_output: float,
               cached_input_fraction: float = 0.0) -> float:
    """Monthly output tokens at which the managed bill equals the self-host bill."""
    per_token = managed_usd_per_million_output(price, input_per_output, cached_input_fraction) / 1e6
    return selfhost_monthly_usd / per_token if per_token > 0 else float("inf")


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


# -- tables ----------------------------------------------------------------------------------
def _col(df: pd.DataFrame, name: str, default: Any) -> pd.Series:
    return df[name] if name in df.columns else pd.Series([default] * len(df), index=df.index)


def cost_table(summary: pd.DataFrame, hourly_usd: float,
               managed: dict[str, ManagedPrice] | Iterable[str] | None = None, *,
               hours: float = HOURS_PER_MONTH, utilization: float = 1.0, fixed_monthly_usd: float = 0.0,
               always_on: bool = True, cached_input_fraction: float = 0.0) -> pd.DataFrame:
    """Per measured level (and managed API): self-host vs managed at the measured throughput.

    `summary` is servelab.summary.summarize() output (aggregate_output_tps, prompt_tokens,
    output_tokens_p50, success_rate per config x bucket x concurrency). One row per level and
    managed price (a single row with managed = None when none are given).
    """
    if managed is None:
        prices: dict[str, ManagedPrice] = {}
    elif isinstance(managed, dict):
        prices = dict(managed)
    else:
        prices = resolve_managed(list(managed))
    rows = []
    s = summary.reset_index(drop=True)
    cfg, bucket = _col(s, "config", ""), _col(s, "bucket", "")
    success = _col(s, "success_rate", 1.0)
    sm = monthly_cost(hourly_usd, hours, utilization, fixed_monthly_usd, always_on)
    all_in_hourly = sm / (hours * (1.0 if always_on else utilization))  # fixed costs spread over billed hours
    for i in range(len(s)):
        agg = float(s.at[i, "aggregate_output_tps"])
        p_tok = float(s.at[i, "prompt_tokens"])
        o_tok = float(s.at[i, "output_tokens_p50"])
        ratio = p_tok / o_tok if o_tok > 0 else float("nan")
        agg_in = agg * ratio
        out_m = monthly_tokens(agg, hours, utilization)
        in_m = out_m * ratio
        req_per_s = agg / o_tok if o_tok > 0 else float("nan")
        base = {
            "config": cfg[i], "bucket": bucket[i], "concurrency": int(s.at[i, "concurrency"]),
            "prompt_tokens": p_tok, "output_tokens": o_tok, "success_rate": float(success[i]),
            "aggregate_output_tps": agg, "aggregate_input_tps": agg_in,
            "hourly_usd": hourly_usd, "all_in_hourly_usd": all_in_hourly,
            "usd_per_m_output": usd_per_million_tokens(all_in_hourly, agg),
            "usd_per_m_input": usd_per_million_tokens(all_in_hourly, agg_in),
            "monthly_output_m_tokens": out_m / 1e6, "monthly_input_m_tokens": in_m / 1e6,
            "selfhost_monthly_usd": sm,
            "selfhost_usd_per_request": all_in_hourly / 3600.0 / req_per_s if req_per_s > 0 else float("nan"),
        }
        if not prices:
            rows.append({**base, "managed": None})
            continue
        for key, price in prices.items():
            mm = managed_cost(in_m, out_m, price, cached_input_fraction)
            be = break_even(sm, price, ratio, cached_input_fraction)
            cap = monthly_tokens(agg, hours, 1.0)
            rows.append({
                **base, "managed": key,
                "managed_monthly_usd": mm,
                "selfhost_to_managed": sm / mm if mm > 0 else float("inf"),
                "managed_usd_per_m_output": managed_usd_per_million_output(price, ratio, cached_input_fraction),
                "break_even_output_m_tokens": be / 1e6,
                "break_even_utilization": be / cap if cap > 0 else float("inf"),
                "managed_usd_per_request": managed_cost(p_tok, o_tok, price, cached_input_fraction),
            })
    return pd.DataFrame(rows)


def replay_cost_table(summary: pd.DataFrame, price: ManagedPrice, cached_input_fraction: float = 0.0) -> pd.DataFrame:
    """What a managed endpoint charged for a replayed workload (host.kind attach): per level."""
    rows = []
    s = summary.reset_index(drop=True)
    for i in range(len(s)):
        ok = int(_col(s, "ok", 0)[i])
        p_tok, o_tok = float(s.at[i, "prompt_tokens"]), float(s.at[i, "output_tokens_p50"])
        per_req = managed_cost(p_tok, o_tok, price, cached_input_fraction)
        rows.append({"config": _col(s, "config", "")[i], "bucket": _col(s, "bucket", "")[i],
                     "concurrency": int(s.at[i, "concurrency"]), "managed": price.key, "ok": ok,
                     "input_tokens": ok * p_tok, "output_tokens": ok * o_tok, "usd": ok * per_req,
                     "usd_per_request": per_req,
                     "usd_per_m_output": managed_usd_per_million_output(price, p_tok / o_tok, cached_input_fraction)
                     if o_tok > 0 else float("nan")})
    return pd.DataFrame(rows)


def seed001_published() -> dict[str, Any]:
    """Seed 001's published numbers (g7e.12xlarge, vLLM, DeepSeek V4 Flash NVFP4) for checks."""
    return {
        "instance_type": "g7e.12xlarge",
        "monthly_usd": 8887.0,  # "約8,887USD ... EC2 On-Demand 730h + ネットワーク・EBS等を含む"
        "hours": 730.0,
        "fireworks": {"input_usd_per_m": 0.22, "output_usd_per_m": 0.66},
        "short_prompt_tokens": 254,  # the 256-token bucket's actual length
        "output_tokens": 256,
        # aggregate output tok/s: (label, concurrency, tok/s)
        "levels": [
            {"config": "cuda-graph", "bucket": "short-ja", "concurrency": 1, "aggregate_output_tps": 104.0},
            {"config": "cuda-graph", "bucket": "in256-out256", "concurrency": 1, "aggregate_output_tps": 102.67},
            {"config": "cuda-graph", "bucket": "in256-out256", "concurrency": 4, "aggregate_output_tps": 297.09},
            {"config": "mtp1", "bucket": "in256-out256", "concurrency": 1, "aggregate_output_tps": 135.55},
            {"config": "mtp1", "bucket": "in256-out256", "concurrency": 4, "aggregate_output_tps": 358.4},
        ],
        "ratio_range": (2.2, 10.7),  # AWS monthly / Fireworks monthly over the 4-way levels
    }


def seed001_summary() -> pd.DataFrame:
    """seed001_published()'s 256-token levels as a summary frame cost_table accepts."""
    d = seed001_published()
    rows = [{**lv, "prompt_tokens": float(d["short_prompt_tokens"]), "output_tokens_p50": float(d["output_tokens"]),
             "success_rate": 1.0} for lv in d["levels"] if lv["bucket"] == "in256-out256"]
    return pd.DataFrame(rows)


# -- dry run ---------------------------------------------------------------------------------
def _money(x: float) -> str:
    return f"${x:,.2f}"


def study_price(study: Any, *, use_api: bool = False, cache_dir: Any = None) -> Any:
    """Price of the study's instance (cost.hourly_usd wins), or None when none applies."""
    from .prices import Price, ec2_hourly_usd

    cost = getattr(study, "cost", None)
    aws = getattr(getattr(study, "host", None), "aws", None)
    if cost is not None and cost.hourly_usd:
        return Price(cost.hourly_usd, "cost.hourly_usd in the params file", "as set", cost.instance_type or "",
                     cost.region or "", "given")
    itype = (cost.instance_type if cost else None) or (aws.instance_type if aws else None)
    region = (cost.region if cost else None) or (aws.regions[0] if aws else None) or "us-east-1"
    if not itype:
        return None
    return ec2_hourly_usd(itype, region, use_api=use_api, cache_dir=cache_dir)


def cost_estimate_lines(study: Any) -> list[str]:
    """What `servelab run --dry-run` prints about money. Never calls AWS (committed table only)."""
    cost = getattr(study, "cost", None)
    aws = getattr(getattr(study, "host", None), "aws", None)
    kind = getattr(getattr(study, "host", None), "kind", "local")
    lines: list[str] = []
    if cost is None and aws is None:
        if kind == "attach":
            return ["cost: managed endpoint; set cost.replay_price to price the measured tokens"]
        return ["cost: local host, no cloud spend (add a cost: block to price the measured throughput)"]
    cost = cost or CostParams()
    try:
        price = study_price(study, use_api=False)
    except PriceError as e:
        price = None
        lines.append(f"cost: no instance price: {e}")
    if price is not None:
        lines.append(f"cost: {price.instance_type or 'instance'} {price.region}: {price.label()} "
                     "[dry run: committed table, no Pricing API call]")
    n_conf = len(study.configurations)
    if aws is not None and price is not None:
        limits = []
        if aws.max_hours:
            limits.append(f"{aws.max_hours:g} h (= {_money(aws.max_hours * price.usd_per_hour)})")
        if aws.max_spend_usd:
            limits.append(f"{_money(aws.max_spend_usd)} (= {aws.max_spend_usd / price.usd_per_hour:.1f} h)")
        lines.append("cost: guard stops the host after " + " or ".join(limits) + ", whichever comes first")
    if price is not None and kind != "attach":
        host_min = cost.startup_estimate_min + max(n_conf - 1, 0) * cost.switch_estimate_min
        if cost.assumed_decode_tps:
            meas_s = 0.0
            for c in study.configurations:  # a round lasts about one request's decode time
                wl = study.workload_for(c.id) if hasattr(study, "workload_for") else study.workload
                rounds = (wl.warmup_rounds + wl.rounds) * wl.requests_per_round * len(wl.concurrency)
                meas_s += sum(rounds * b.output_tokens / cost.assumed_decode_tps for b in wl.buckets)
            host_min += meas_s / 60
            how = (f"first start ~{cost.startup_estimate_min:g} min, ~{cost.switch_estimate_min:g} min per switch, "
                   f"~{meas_s / 60 / max(n_conf, 1):.1f} min measuring per configuration at an assumed "
                   f"{cost.assumed_decode_tps:g} tok/s per request")
        else:
            how = (f"first start ~{cost.startup_estimate_min:g} min, ~{cost.switch_estimate_min:g} min per switch; "
                   "measuring time not estimated (set cost.assumed_decode_tps)")
        lines.append(f"cost: estimated run: {n_conf} configurations, ~{host_min:.0f} min of host time "
                     f"= ~{_money(host_min / 60 * price.usd_per_hour)} ({how})")
        fixed = sum(cost.fixed_monthly_usd.values())
        m = monthly_cost(price.usd_per_hour, cost.hours_per_month, cost.utilization, fixed, cost.always_on)
        fx = (" + fixed " + ", ".join(f"{k} {_money(v)}" for k, v in cost.fixed_monthly_usd.items())) if fixed else ""
        lines.append(f"cost: monthly self-host at {cost.hours_per_month:g} h: {_money(m)}{fx}, utilization "
                     f"{cost.utilization:g} ({'always on' if cost.always_on else 'billed only while busy'})")
    for key, mp in resolve_managed(cost.managed).items():
        lines.append(f"cost: managed reference {mp.label()}")
    if cost.replay_price:
        lines.append(f"cost: replayed endpoint priced as {resolve_managed([cost.replay_price])[cost.replay_price].label()}")
    return lines


__all__ = [
    "CostParams", "HOURS_PER_MONTH", "break_even", "cost_estimate_lines", "cost_table", "managed_cost",
    "managed_prices", "managed_usd_per_million_output", "monthly_cost", "monthly_tokens", "replay_cost_table",
    "resolve_managed", "seed001_published", "seed001_summary", "study_price", "usd_per_million_tokens",
]
