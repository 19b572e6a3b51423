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
The published comparison in data/seed001.yaml works this way: 4-way aggregate tok/s held for
730 h, input at the bucket's prompt/output ratio, AWS 8,887 USD/month all-in vs Fireworks
0.22 / 0.66 USD per 1M.
The write-up's cost section is computed here from measured summaries, never typed in.
"""

from __future__ import annotations

import copy
import math
from typing import Any, Iterable

import pandas as pd

from ..prices import ManagedPrice, PriceError, fixed_prices_table, managed_prices, resolve_managed, seed001_table
from .. import hosts
from ..prices import Price, ec2_hourly_usd
from ..schema import HOURS_PER_MONTH, CostParams


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
    """The published numbers (g7e.12xlarge, vLLM, DeepSeek V4 Flash NVFP4), from
    data/seed001.yaml with its source and date: what the checks, the dry run and the write-up put
    beside servelab's own figures. `ratio_range` is a (low, high) tuple; `fixed` the costs it counts."""
    d = copy.deepcopy(seed001_table())
    d["ratio_range"] = tuple(d["ratio_range"])
    return d


def vs_published(measured: float, published: float | tuple[float, float], *, source: str = "seed 001",
                 unit: str = "x", digits: int = 2) -> str:
    """A measured figure with the published one beside it: "12.96x (seed 001 published: 2.2-10.7x)"."""
    if isinstance(published, tuple):
        pub = f"{published[0]:g}-{published[1]:g}{unit}"
    else:
        pub = f"{published:g}{unit}"
    return f"{measured:.{digits}f}{unit} ({source} published: {pub})"


def seed001_monthly(region: str = "us-east-1", instance_hourly_usd: float | None = None) -> dict[str, Any]:
    """The published 8,887 USD/month (data/seed001.yaml) rebuilt from list prices: the instance for
    730 h plus the fixed costs it counts (its `fixed`), each with its dated source, and the gap the
    publication does not itemise. Returns {"items": [(label, usd, basis, source)], "itemised_usd",
    "published_usd", "not_itemised_usd"}. Raises KeyError for a region without fixed prices,
    PriceError without an instance price."""
    pub = seed001_published()
    hours = pub["hours"]
    if instance_hourly_usd is None:
        price = ec2_hourly_usd(pub["instance_type"], region, use_api=False)
        inst = (price.usd_per_hour, f"data/prices.yaml: {price.status}, as of {price.as_of}")
    else:
        inst = (instance_hourly_usd, "as given")
    items = [(f"{pub['instance_type']} On-Demand", inst[0] * hours, f"{inst[0]:g} USD/h x {hours:g} h", inst[1])]
    fixed = fixed_prices_table()["regions"][region]
    for item in pub["fixed"]:
        label, qty, unit = item["label"], float(item["quantity"]), item["unit"]
        e = fixed[item["key"]]
        usd = float(e["usd"]) * qty * (hours if unit == "h" else 1.0)
        basis = (f"{e['usd']} USD/h x {hours:g} h" if unit == "h" else
                 f"{e['usd']} USD/GB-month x {qty:g} GB" if unit == "month" else f"{e['usd']} USD/GB x {qty:g} GB")
        items.append((label, usd, basis, f"{e['source']}, as of {e['as_of']}, {e['status']}"))
    total = sum(u for _, u, _, _ in items)
    return {"items": items, "itemised_usd": total, "published_usd": pub["monthly_usd"],
            "not_itemised_usd": pub["monthly_usd"] - total, "region": region}


def seed001_cost_lines(region: str = "us-east-1", instance_hourly_usd: float | None = None) -> list[str]:
    """The published cost table (data/seed001.yaml), reproduced: the month itemised (seed001_monthly)
    and the AWS / Fireworks ratio at each published 4-way throughput, each beside the published figures."""
    pub = seed001_published()
    m = seed001_monthly(region, instance_hourly_usd)
    lines = [f"cost: seed 001's month, itemised at {region} list prices (published: {_money(pub['monthly_usd'])} = "
             f"\"{pub['monthly_includes']}\"):"]
    lines += [f"cost:   {label}: {_money(usd)} ({basis}; {src})" for label, usd, basis, src in m["items"]]
    gap = m["not_itemised_usd"]
    lines.append(f"cost:   itemised {_money(m['itemised_usd'])}; not itemised by the seed: {_money(gap)} "
                 f"({gap / pub['monthly_usd']:.1%} of its {_money(pub['monthly_usd'])})")
    fw = ManagedPrice(key="seed001/fireworks", provider="Fireworks AI", model="DeepSeek V4 Flash",
                      input_usd_per_m=pub["fireworks"]["input_usd_per_m"],
                      output_usd_per_m=pub["fireworks"]["output_usd_per_m"], cache_read_usd_per_m=None,
                      status="published", source=pub["source"], as_of=pub["as_of"])
    t = cost_table(seed001_summary(), pub["monthly_usd"] / pub["hours"], {"fireworks": fw})
    ours = cost_table(seed001_summary(), m["itemised_usd"] / pub["hours"], {"fireworks": fw})
    for (_, r), (_, o) in zip(t.iterrows(), ours.iterrows()):
        if r.concurrency != 4:
            continue
        lines.append(f"cost: AWS / Fireworks at seed 001's {r.config} c=4 {r.aggregate_output_tps:g} tok/s (254-token "
                     f"prompts): at its {_money(pub['monthly_usd'])}/month "
                     f"{vs_published(r.selfhost_to_managed, pub['ratio_range'])}; at the itemised "
                     f"{_money(m['itemised_usd'])} {vs_published(o.selfhost_to_managed, pub['ratio_range'])}")
    lines.append("cost: the seed's 2.2x end is a level whose throughput its text does not give (longer prompts: more "
                 "input tokens per output token make the managed bill larger)")
    return lines


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
    cost = study.cost
    aws = getattr(study.host, "aws", None)
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
    cost = study.cost
    aws = getattr(study.host, "aws", None)
    basis = hosts.get(study.host.kind).cost_basis
    lines: list[str] = []
    if cost is None and aws is None:
        if basis == "endpoint":
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
    if price is not None and basis != "endpoint":
        host_min = cost.startup_estimate_min + max(n_conf - 1, 0) * cost.switch_estimate_min
        if cost.assumed_decode_tps:
            meas_s = 0.0
            for c in study.configurations:  # a round lasts about one request's decode time
                wl = study.workload_for(c.id)
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
    if study.study in PUBLISHED_COST:  # a published study's own cost table, reproduced beside what servelab prints
        lines += PUBLISHED_COST[study.study]()
    return lines


#: study id -> the lines that reproduce the published cost table it repeats
PUBLISHED_COST = {"seed-001-vllm-g7e": seed001_cost_lines}


__all__ = [
    "CostParams", "HOURS_PER_MONTH", "break_even", "cost_estimate_lines", "cost_table", "managed_cost",
    "managed_prices", "managed_usd_per_million_output", "monthly_cost", "monthly_tokens", "replay_cost_table",
    "resolve_managed", "seed001_cost_lines", "seed001_monthly", "seed001_published", "seed001_summary",
    "study_price", "usd_per_million_tokens", "vs_published",
]
