"""The performance model's parallel terms (`analysis.perfmodel`): how one configuration's layout
(`engines.Layout`) changes a decode or prefill step of one replica.

- Tensor parallel over t GPUs: every GPU of the replica reads 1/t of the weights and of the KV cache
  (the KV heads split, `models.facts.kv_bytes_per_token`) and computes 1/t of the FLOPs; each layer adds
  two all-reduces (after attention, after the MLP or MoE) of the step's activations, rows x hidden x
  dtype bytes, each costing alpha + bytes / beta with alpha and beta measured for t GPUs
  (`servelab calibrate-hw --collectives`, `micro.collectives` of the calibration entry).
- Expert parallel over e GPUs: the routed experts are split over e GPUs instead of sliced over the TP
  group; each GPU reads 1/e of the experts the step touches (the mean share: the busiest GPU's load is not
  modelled, so every EP figure is a bound). Inside one replica (vLLM's TP x EP with DP = 1, SGLang's
  ep-size within the TP group) every GPU holds every token and the MoE layer's combine is its TP
  all-reduce; across replicas (vLLM DP x EP) each MoE layer adds a dispatch and a combine all-to-all
  of rows x k x hidden x dtype bytes at e GPUs' alpha + bytes / beta.
- Data parallel over d replicas: each replica is an independent engine (`perfmodel.predict` splits the
  concurrency over the replicas and adds their throughput up).

A collective without a calibration for its GPU count costs nothing here: the TPOT is then a lower
bound (labelled so, with the reason). No I/O; not for the single-GPU arithmetic (`perfmodel`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..engines.base import Layout
from .roofline import _dtype_bytes, decode_weight_bytes

ALL_REDUCE, ALL_TO_ALL = "all_reduce", "all_to_all"


@dataclass(frozen=True)
class Parallel:
    """One replica's spread: `tp` GPUs share its weights and KV cache, its experts over `ep` GPUs
    (`ep_across`: the experts' GPUs span several replicas, so tokens travel by all-to-all), `replicas`
    independent copies; `all_reduce` / `all_to_all`: (alpha_s, beta_Bps) at tp / ep GPUs, None when not
    calibrated."""

    tp: int = 1
    ep: int = 1
    replicas: int = 1
    pp: int = 1
    dp_attention: bool = False
    ep_across: bool = False
    all_reduce: tuple[float, float] | None = None
    all_to_all: tuple[float, float] | None = None
    label: str = "TP=1"
    gpus: int = 1

    @classmethod
    def of(cls, layout: Any, collective: Any) -> "Parallel":
        """From an `engines.Layout` and a lookup `collective(op, n) -> (alpha_s, beta_Bps) | None`."""
        ep_across = layout.ep > 1 and layout.replicas > 1
        return cls(tp=layout.tp * layout.pp, ep=layout.ep, replicas=layout.replicas, pp=layout.pp,
                   dp_attention=layout.dp_attention, ep_across=ep_across,
                   all_reduce=collective(ALL_REDUCE, layout.tp) if layout.tp > 1 else None,
                   all_to_all=collective(ALL_TO_ALL, layout.ep) if ep_across else None,
                   label=layout.label(), gpus=layout.gpus)

    # -- bytes ------------------------------------------------------------------------------------
    def weight_bytes(self, facts: Mapping[str, Any], distinct: float) -> float:
        """Weight bytes one GPU of the replica reads in a step of `distinct` distinct tokens: the
        non-expert part over tp, the touched experts over ep (over tp without expert parallel)."""
        return self._per_gpu(decode_weight_bytes(facts, max(1, int(round(distinct)))),
                             lambda: expert_bytes(facts, touched=True, distinct=distinct))

    def static_weight_bytes(self, facts: Mapping[str, Any]) -> float:
        """The weights one GPU holds (what the KV cache's memory share is left after)."""
        return self._per_gpu(float(facts["weight_bytes"]), lambda: expert_bytes(facts, touched=False))

    def _per_gpu(self, total: float, experts: Any) -> float:
        """One GPU's share of `total` weight bytes: all of it over tp, or, with the experts (`experts()`
        bytes) split over ep GPUs other than the TP group, the rest over tp and the experts over ep."""
        if self.ep <= 1 or self.ep == self.tp:
            return total / self.tp
        e = experts()
        return (total - e) / self.tp + e / self.ep

    # -- communication ----------------------------------------------------------------------------
    def comm_s(self, facts: Mapping[str, Any], rows: float) -> float:
        """Seconds of the step's collectives for `rows` token rows (0 for what is not calibrated)."""
        b = _dtype_bytes(facts) * float(facts["hidden_size"]) * float(rows)
        t = 0.0
        if self.all_reduce:
            t += 2.0 * float(facts["num_layers"]) * collective_s(self.all_reduce, b)
        if self.all_to_all:
            k = float(facts.get("num_active_experts") or 1)
            t += 2.0 * float(facts.get("num_moe_layers") or 0) * collective_s(self.all_to_all, b * k)
        return t

    def bound_because(self, facts: Mapping[str, Any]) -> list[str]:
        """Why this layout's figures are bounds ([] when the layout's terms are all calibrated)."""
        moe = bool(facts.get("num_experts"))
        return [why for why, cond in (
            (f"tensor parallel: the all-reduce cost is not calibrated for {self.tp} GPUs (servelab calibrate-hw "
             "--collectives): costed at zero, a lower bound on TPOT", self.tp > 1 and self.all_reduce is None),
            (f"expert parallel: the all-to-all cost is not calibrated for {self.ep} GPUs: costed at zero",
             self.ep_across and self.all_to_all is None),
            ("expert parallel: each GPU's share of the touched experts is the mean (the busiest GPU's load is not "
             "modelled)", moe and self.ep > 1),
            ("pipeline parallel is not modelled (its stages costed as tensor-parallel shards)", self.pp > 1),
            ("DP attention is not modelled (costed as the TP group without it)", self.dp_attention),
        ) if cond]

    def inputs(self) -> list[dict[str, Any]]:
        """The prediction's inputs that say how the layout was costed."""
        def c(v: tuple[float, float] | None) -> Any:
            return {"alpha_s": v[0], "beta_Bps": v[1]} if v else None
        return [
            {"name": "layout", "value": self.label, "source": "the engine's parallel flags (engines.Layout)"},
            {"name": "replicas (DP)", "value": self.replicas,
             "source": "independent engines: the concurrency split over them, their throughput added"},
            {"name": f"all-reduce at {self.tp} GPUs (alpha, beta)", "value": c(self.all_reduce),
             "source": "calibration entry micro.collectives (calibrate-hw --collectives)" if self.all_reduce
             else "not calibrated: costed at zero"},
            {"name": f"all-to-all at {self.ep} GPUs (alpha, beta)", "value": c(self.all_to_all),
             "source": "calibration entry micro.collectives" if self.all_to_all else
             ("not calibrated: costed at zero" if self.ep_across else "no all-to-all (experts inside one replica)")},
        ]


def distinct_experts(E: float, k: float, tokens: float) -> float:
    """Expected distinct experts of E that `tokens` tokens touch, each routed to k of them uniformly
    and independently: E * (1 - (1 - k/E)^tokens)."""
    if tokens <= 0:
        return 0.0
    return E * (1.0 - (1.0 - k / E) ** tokens)


def parallel_for(layout: Any, n_gpus: int, collective: Any) -> Parallel | None:
    """The layout's terms (`n_gpus` > 1 without a layout: that many tensor-parallel GPUs), or None on one GPU
    (the single-GPU arithmetic, unchanged)."""
    layout = layout if layout is not None else Layout(tp=max(1, int(n_gpus)))
    return Parallel.of(layout, collective) if layout.gpus > 1 else None


def replicas_tpot(replicas: int, c: int, one: Any) -> float:
    """The mean TPOT of a request at concurrency c spread over the replicas (`one(x)`: a replica's TPOT at
    x requests), each request weighted alike."""
    if replicas <= 1:
        return one(c)
    counts = [x for x in replica_counts(c, replicas) if x > 0]
    return sum(x * one(x) for x in counts) / sum(counts)


def collective_s(ab: tuple[float, float], nbytes: float) -> float:
    """One collective of `nbytes` per GPU: alpha + bytes / beta."""
    return ab[0] + nbytes / ab[1]


def expert_bytes(facts: Mapping[str, Any], *, touched: bool, distinct: float = 1.0) -> float:
    """Bytes of the routed experts: those `distinct` tokens touch (`touched`), or all of them."""
    E, k, active = facts.get("num_experts"), facts.get("num_active_experts"), facts.get("active_param_count")
    if not (E and k and active) or E <= k:
        return 0.0
    per_expert = (float(facts["param_count"]) - float(active)) / (float(E) - float(k))
    n = distinct_experts(float(E), float(k), max(1, int(round(distinct)))) if touched else float(E)
    return n * per_expert * _dtype_bytes(facts)


def replica_counts(c: int, replicas: int) -> list[int]:
    """c requests spread evenly over the replicas (the busier ones first): 5 over 2 -> [3, 2]."""
    q, r = divmod(int(c), max(1, replicas))
    return [q + 1] * r + [q] * (replicas - r)


__all__ = ["ALL_REDUCE", "ALL_TO_ALL", "Parallel", "collective_s", "distinct_experts", "expert_bytes",
           "parallel_for", "replica_counts", "replicas_tpot"]
