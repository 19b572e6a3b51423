"""The performance model: what a configuration should do, from the model's facts, the engine's
settings and the *measured* parameters of the machine (a calibration entry, `data/calibrations/`,
written by `servelab calibrate-hw`), never from the study's own results. Its prediction is stored
before the first request (`prediction.json`), so it is never fitted to what it is compared with.

One decode step of a batch of B sequences, each with `ctx` tokens of context:

    t_step(B) = max(bytes(B) / BW(B), flops(B) / F(B)) + step_cost + sum over layers of layer_cost(kind)

- bytes(B): weights read once per step (the input embedding is a lookup; a MoE layer reads its
  dense part and the experts its tokens touch: E * (1 - (1 - k/E)^D) of E for D *distinct* tokens,
  and requests that are identical and decoded deterministically emit the same token, so they route
  as one) plus every sequence's KV cache (`ctx * kv_bytes_per_token`; a sliding-window layer reads
  at most its window);
- BW(B): the machine's decode-like bandwidth (bf16 matrix-vector products streaming weights far
  larger than the caches, measured at B = 1, 8, 32; on the CPU engine, its own bandwidth from two
  calibration widths);
- F(B): bf16 (or fp8) GEMM throughput at that many rows;
- step_cost, layer_cost(kind): the engine's fixed costs in that mode (CUDA graphs or eager), fitted
  from calibration models of 2, 4 and 8 layers of each kind (dense, moe: grouped-query attention;
  mla: latent attention), whose weights are too small to matter;
- engine terms (`perfmodel_terms`, data/engine_terms.yaml): a cost a diagnosis measured for one
  engine setting, with its source study and runs (SGLang's FA3 MLA backend with an fp8 KV cache
  converts its whole KV pool every step: seconds per pool byte), added to the GPU's time.

TPOT at concurrency c (a closed loop of requests with `input` prompt and `output` new tokens): the
decode step at B = c with the mean context `input + output / 2`, plus the prefills of the other
requests. How they ride depends on the arrivals:
- staggered (requests that end at end-of-sequence, or open-loop arrivals): each of the other c - 1
  requests' prefills rides in one of a request's `output` steps (a step of B + input rows, whose
  prompt tokens route to experts too);
- in waves (a closed loop whose requests all have one forced length): the c requests start together,
  their c prompts are prefilled at the wave's start, and a request whose first token comes early
  waits in its decode for the prefills still to run, on average half of the wave's, so TPOT gains
  half the prefill of c x input tokens over its output - 1 gaps.
Prefill of n tokens (`prefill_step`), in chunks of the engine's batch budget: on the GPU, max(weights
touched / BW, FLOPs / F) plus the per-layer fixed time; FLOPs = 2 * matmul parameters * n + attention's
2 * layers * heads * head_dim * n^2, each GEMM at the measured throughput of its work (a layer's mean GEMM
at n rows; a MoE layer's experts as one grouped GEMM of n * k rows); plus the engine's MoE prefill term per
MoE layer when the calibration entry has one. The CPU side: a step inside a captured graph (vLLM: up to
min(2 x max-num-seqs, 512) tokens) pays the step's floor (+ latent attention's launches between the graph's pieces,
`calibrate-hw --mla-prefill-from`), the longer of it and the GPU; a larger one launches its
kernels at the eager cost per layer of each kind (dense, MoE, MoE with shared experts, latent attention) ahead of
the GPU: the longer of the two plus the share of the shorter the host waits on (`launch_wait`). TTFT at c = 1 =
the engine's request cost (HTTP, chat template, tokenization, scheduling, the token's way back: fitted with
`launch_wait` on published TTFTs, `calibrate-hw --ttft-from`) + the prefill. The KV-limited concurrency and the
capacity at the SLO follow (`predict`). Every estimate carries a band (`analysis.transfer`).

A GPU without a calibration entry of its own takes the nearest calibrated GPU's terms carried by the
datasheets (bandwidth and FLOP/s shares, per-layer kernel time by clock, the host's CPU-side terms as
measured there; `analysis.transfer`), each labelled with its rule and source.

Several GPUs (`perfmodel_parallel`, from the engine's `Layout`): tensor parallel splits the weights,
the KV cache and the FLOPs over t GPUs and adds two all-reduces per layer of the step's activations at
alpha + bytes / beta (measured by `calibrate-hw --collectives`); expert parallel splits the experts'
bytes (an all-to-all when they span replicas); data parallel runs d independent replicas, each at c / d
of the concurrency, their throughput added.

What is not calibrated is a *bound* and labelled so: tensor parallelism without a measured all-reduce for
its GPU count (costed at zero), expert parallelism (the mean GPU's share of the experts), pipeline
parallelism and DP attention (not modelled), speculative decoding (one token per step assumed), an engine or mode without its own calibration,
linear-attention or SSM layers (never calibrated), an engine term whose pool size is unknown.
No I/O but reading the calibration entries; not for words (`report.capacity`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .. import engines
from ..engines.flags import get_flag
from ..models.facts import kv_bytes_per_token, kv_read_bytes_per_token
from . import perfmodel_terms as terms
from .calibration import Machine, machine_for
from .kv import flag_kv_tokens, kv_block
from .perfmodel_parallel import Parallel, distinct_experts, parallel_for, replicas_tpot
from .roofline import decode_weight_bytes, prefill_matmul_params

# 2: prefills in waves; 3: facts of any architecture, engine terms, MoE prefill per expert GEMM; 4: TTFT as an
# estimate (request cost + prefill steps, in a graph or launched), terms carried to uncalibrated GPUs, bands, ties
# through a score-correction bias; 5: the host factor (analysis.hosts); 6: a step without graphs: max(launches, GPU) +
# the share the host waits on, MoE layers with shared experts at their own cost; 7: latent attention's launches inside
# a graph's prefill (vLLM runs attention between the graph's pieces: calibrate-hw --mla-prefill-from)
MODEL_VERSION = "perfmodel-7"
FORMAT_VERSION = 1
KINDS = ("dense", "moe", "mla")
ESTIMATE, BOUND = "estimate", "bound"


# -- the model ----------------------------------------------------------------------------------

def layer_counts(facts: Mapping[str, Any]) -> dict[str, int]:
    """How many layers of each calibrated kind the model has; a latent-attention layer with a dense MLP counts as
    `mla_dense` (mla + dense - moe), a GQA MoE layer with shared experts as `moe_shared` (else `moe`'s costs)."""
    n = int(facts["num_layers"])
    moe = int(facts.get("num_moe_layers", n if facts.get("num_experts") else 0))
    if facts.get("attention") == "mla" or facts.get("kv_lora_rank"):
        return {k: v for k, v in (("mla", moe), ("mla_dense", n - moe)) if v}
    kind = "moe_shared" if int(facts.get("num_shared_experts") or 0) > 0 else "moe"
    return {k: v for k, v in ((kind, moe), ("dense", n - moe)) if v}


def mode_of(engine: str, args: Mapping[str, Any]) -> str:
    """graphs or eager: how the engine runs its decode steps with these flags (on the CPU engine
    "graphs" is torch.compile's compiled mode; only its eager mode is calibrated there, so a compiled
    configuration's prediction uses the eager costs and is labelled a bound)."""
    return engines.get(engine).decode_mode(args)


def _precision(facts: Mapping[str, Any]) -> str:
    return "fp8" if "float8" in str(facts.get("dtype", "")) else "bf16"


def weight_bytes(facts: Mapping[str, Any], distinct_tokens: float) -> float:
    """Weight bytes one decode step reads for `distinct_tokens` distinct tokens (roofline's rule)."""
    return decode_weight_bytes(facts, max(1, int(round(distinct_tokens))))


def launched_step(m: Machine, engine: str, cpu_s: float, gpu_s: float) -> float:
    """A step launched kernel by kernel: max(launches, GPU) + the share of the shorter the host waits on."""
    return max(cpu_s, gpu_s) + m.launch_wait(engine) * min(cpu_s, gpu_s)


def step_time(m: Machine, engine: str, mode: str, facts: Mapping[str, Any], *, batch: int, ctx: float,
              kv_bpt: float, distinct: float, n_gpus: int = 1, prefill_tokens: float = 0.0,
              extra_s: float = 0.0, par: Parallel | None = None, graph_tokens: int | None = None) -> dict[str, Any]:
    """One decode step of `batch` sequences (and, when `prefill_tokens`, a prefill riding in it);
    `extra_s`: the engine terms this configuration pays per step (GPU work, `perfmodel_terms`); `par`: a
    layout of several GPUs (its per-GPU weight bytes and its collectives; `n_gpus` its TP size);
    `graph_tokens`: the most tokens a step runs inside a captured graph (None: every step does), beyond
    which the step's CPU side is the eager launch costs (`prefill_step`)."""
    bw, _ = m.bandwidth(engine, batch)
    wbytes = par.weight_bytes(facts, distinct) if par else weight_bytes(facts, distinct) / n_gpus
    comm = par.comm_s(facts, batch + prefill_tokens) if par else 0.0
    kvbytes = batch * ctx * kv_bpt
    mm = prefill_matmul_params(facts)
    prec = _precision(facts)
    f_dec, _ = m.flops(prec, max(batch, 1))
    t_mem = (wbytes + kvbytes) / bw
    t_cmp = 2.0 * mm * batch / n_gpus / f_dec if f_dec == f_dec else 0.0
    if prefill_tokens:
        f_pre, _ = m.flops(prec, prefill_tokens)
        t_cmp += prefill_flops(facts, prefill_tokens) / n_gpus / f_pre
    counts = layer_counts(facts)
    cpu, gpu, _, _ = m.fixed(engine, mode, counts)
    if m.kind == "cpu":  # the CPU engine computes on the cores that also run its steps: everything adds up
        total = max(t_mem, t_cmp) + (cpu or 0.0) + gpu + extra_s + comm
    elif mode == "eager" or (mode == "graphs" and graph_tokens is not None and batch + prefill_tokens > graph_tokens):
        cpu = m.eager_cpu(engine, counts)[0] or cpu  # eager, or a step too large for the captured graphs
        total = launched_step(m, engine, cpu or 0.0, max(t_mem, t_cmp) + gpu + extra_s + comm)
    else:  # the GPU runs its kernels while the CPU side prepares the next step: the longer of the two
        total = max(cpu or 0.0, max(t_mem, t_cmp) + gpu + extra_s + comm)
    return {"memory_s": t_mem, "compute_s": t_cmp, "cpu_s": cpu or 0.0, "gpu_fixed_s": gpu, "terms_s": extra_s,
            "comm_s": comm, "total_s": total}


def prefill_flops(facts: Mapping[str, Any], n: float, seqs: float = 1.0) -> float:
    """FLOPs of a prefill of n tokens in `seqs` prompts of n / seqs tokens each: the matmuls'
    2 * params * n and causal attention's 2 * layers * heads * head_dim * (n / seqs)^2 per prompt
    (QK^T and PV, half of the square each)."""
    head = float(facts.get("head_dim") or 128)
    per = n / max(seqs, 1.0)
    kinds = facts.get("kv_layers") or {}
    attn_layers = (sum(v for k, v in kinds.items() if k != "linear_attention") if kinds
                   else float(facts["num_layers"]))  # linear / SSM layers have no quadratic term
    return (2.0 * prefill_matmul_params(facts) * n
            + 2.0 * float(attn_layers) * float(facts["num_heads"]) * head * per * per * max(seqs, 1.0))


def expert_split(facts: Mapping[str, Any], n: float) -> tuple[float, float]:
    """(matmul parameters of the routed experts n prompt tokens take, summed over tokens' top-k, per
    token; the rows each touched expert's GEMM gets): a MoE prefill runs one GEMM per touched
    expert of n * k / touched rows, far fewer than n."""
    E, k = facts.get("num_experts"), facts.get("num_active_experts")
    if not (E and k and facts.get("active_param_count")) or E <= k:
        return 0.0, float(n)
    per_expert = (float(facts["param_count"]) - float(facts["active_param_count"])) / (float(E) - float(k))
    touched = distinct_experts(float(E), float(k), n)
    return float(k) * per_expert, (n * float(k) / touched if touched > 0 else float(n))


#: the GEMMs of one layer's dense part in vLLM and SGLang: fused QKV, the output projection, fused gate-up, down
GEMMS_PER_LAYER = 4


def gemm_rate(m: Machine, precision: str, rows: float, params_per_gemm: float) -> float:
    """The measured GEMM throughput (the calibration's micro-benchmark, one k x n shape at several row
    counts) at a GEMM of `rows` x `params_per_gemm` weights, read at the rows that give the micro-benchmark's
    shape the same work: a wide layer at few rows fills the GPU as the micro-benchmark's square does at more."""
    shape = (m.entry.get("micro") or {}).get("gemm_shape") or {"k": 4096, "n": 4096}
    eq = float(rows) * float(params_per_gemm) / (float(shape["k"]) * float(shape["n"]))
    return m.flops(precision, max(eq, 1.0))[0]


def prefill_compute_s(m: Machine, facts: Mapping[str, Any], n: float, seqs: float = 1.0) -> float:
    """The GPU's matmul and attention time of a prefill of n tokens (in `seqs` prompts) on one GPU: the
    dense part's GEMMs and the attention at the throughput of a layer's mean GEMM at n rows, a MoE
    layer's expert GEMMs as one grouped GEMM of n x k rows (its work over the touched experts), each at
    the measured throughput of that much work (`gemm_rate`)."""
    prec = _precision(facts)
    mm = prefill_matmul_params(facts)
    exp_params, _ = expert_split(facts, n)
    dense = max(mm - exp_params, 1.0)
    layers = max(int(facts.get("num_layers") or 1), 1)
    f_dense = gemm_rate(m, prec, n, dense / layers / GEMMS_PER_LAYER)
    if f_dense != f_dense:
        return 0.0
    attn = prefill_flops(facts, n, seqs) - 2.0 * mm * n
    t = (2.0 * dense * n + attn) / f_dense
    if exp_params:
        k = float(facts.get("num_active_experts") or 1)
        moe_layers = max(int(facts.get("num_moe_layers") or layers), 1)
        per_expert_layer = exp_params / k / moe_layers  # one expert's parameters in one MoE layer
        t += 2.0 * exp_params * n / gemm_rate(m, prec, n * k, per_expert_layer / 2.0)
    return t


def prefill_step(m: Machine, engine: str, mode: str, facts: Mapping[str, Any], n: float, n_gpus: int = 1,
                 seqs: float = 1.0, par: Parallel | None = None, *, graph_tokens: int | None = None,
                 chunk: int | None = None, ties: bool = False) -> dict[str, Any]:
    """The engine's steps that prefill n prompt tokens (in `seqs` prompts), split in chunks of `chunk`
    tokens (chunked prefill's budget), each:
    - the GPU: the weights its tokens touch over the bandwidth (`ties`: every token takes the same experts),
      or its matmuls and attention (`prefill_compute_s`), plus the per-layer fixed time, the engine's MoE
      prefill term when calibrated, and the collectives;
    - the CPU side: inside a captured graph (`graph_tokens`: the engine's largest; None: always) the step's floor and
      latent attention's launches, the step the longer of it and the GPU; outside, each layer's eager launch costs
      (`launched_step`).
    Returns the parts and `total_s`."""
    chunks = max(1, math.ceil(n / chunk)) if chunk else 1
    nc = n / chunks
    counts = layer_counts(facts)
    bw, _ = m.bandwidth(engine, nc)
    distinct = 1.0 if ties else nc
    t_mem = (par.weight_bytes(facts, distinct) if par else weight_bytes(facts, distinct) / n_gpus) / bw
    t_cmp = prefill_compute_s(m, facts, n, seqs) / chunks / n_gpus
    comm = par.comm_s(facts, nc) if par else 0.0
    cpu, gpu, _, _ = m.fixed(engine, mode, counts)
    moe = terms.moe_prefill(m.entry, engine) if facts.get("num_experts") else None
    t_moe = terms.moe_prefill_seconds(moe, int(facts.get("num_moe_layers") or 0), nc) / n_gpus if moe else 0.0
    gpu_s = max(t_mem, t_cmp) + gpu + t_moe + comm
    in_graph = mode == "graphs" and (graph_tokens is None or nc <= graph_tokens)
    if m.kind == "cpu":
        step, cpu_s, how = max(t_mem, t_cmp) + (cpu or 0.0) + gpu + t_moe + comm, cpu or 0.0, "cpu"
    elif in_graph:
        cpu_s = (cpu or 0.0) + m.graph_prefill_cpu(engine, counts)
        step, how = max(cpu_s, gpu_s), "graph"
    else:
        cpu_s = m.eager_cpu(engine, counts)[0] or cpu or 0.0
        step, how = launched_step(m, engine, cpu_s, gpu_s), "launched"
    return {"chunks": chunks, "memory_s": t_mem, "compute_s": t_cmp, "gpu_s": gpu_s, "cpu_s": cpu_s, "how": how,
            "total_s": chunks * step}


def prefill_time(m: Machine, engine: str, mode: str, facts: Mapping[str, Any], n: float, n_gpus: int = 1,
                 seqs: float = 1.0, par: Parallel | None = None, **kw: Any) -> float:
    """The seconds of `prefill_step` (the engine's steps only: a TTFT adds the request's fixed cost)."""
    return prefill_step(m, engine, mode, facts, n, n_gpus, seqs, par, **kw)["total_s"]


def tpot(m: Machine, engine: str, mode: str, facts: Mapping[str, Any], c: int, n_in: float, n_out: float,
         kv_bpt: float, identical: bool, n_gpus: int = 1, waves: bool = False, extra_s: float = 0.0,
         par: Parallel | None = None, pre: Mapping[str, Any] | None = None) -> float:
    """Mean time per output token of a request at concurrency c: decode steps at batch c plus the
    other requests' prefills; `waves`: the c requests start together (a closed loop of one forced
    length) and a request's decode waits, on average, for half of the wave's c prefills; else a share
    (c - 1) / output of its steps also carries another request's prefill. `pre`: `prefill_step`'s
    keywords (the engine's graph size and chunk, whether dummy weights tie the router)."""
    pre = dict(pre or {})
    ctx = n_in + n_out / 2.0
    distinct = 1 if identical else c
    plain = step_time(m, engine, mode, facts, batch=c, ctx=ctx, kv_bpt=kv_bpt, distinct=distinct, n_gpus=n_gpus,
                      extra_s=extra_s, par=par)
    if c <= 1 or n_out <= 1:
        return plain["total_s"]
    if waves:
        wave = prefill_time(m, engine, mode, facts, c * n_in, n_gpus, seqs=c, par=par, **pre)
        return plain["total_s"] + wave / 2.0 / (n_out - 1)
    mixed = step_time(m, engine, mode, facts, batch=c, ctx=ctx, kv_bpt=kv_bpt,
                      distinct=distinct + (1 if pre.get("ties") else n_in), n_gpus=n_gpus, prefill_tokens=n_in,
                      extra_s=extra_s, par=par, graph_tokens=pre.get("graph_tokens"))  # the prompt's tokens route too
    share = min(1.0, (c - 1) / n_out)
    return (1 - share) * plain["total_s"] + share * mixed["total_s"]


def kv_tokens(engine: str, facts: Mapping[str, Any], args: Mapping[str, Any], m: Machine | None, n_gpus: int,
              kv_dtype: str, par: Parallel | None = None) -> tuple[float, str]:
    """KV-cache tokens the flags allow (SGLang's max-total-tokens, vLLM's forced blocks or byte
    budget), else the memory share left after the weights (an upper bound: activations and graphs
    take some of it)."""
    from .predict import DEFAULT_GPU_MEMORY_UTILIZATION

    bpt = kv_bytes_per_token(facts, kv_dtype, n_gpus)
    block = kv_block(args)
    forced = engines.get(engine).forced_kv_tokens(args) or flag_kv_tokens(args, bpt)
    if forced:
        return forced
    if m is not None and m.memory_bytes:
        util = float(get_flag(args, "gpu-memory-utilization") or get_flag(args, "mem-fraction-static")
                     or DEFAULT_GPU_MEMORY_UTILIZATION)
        held = par.static_weight_bytes(facts) if par else float(facts["weight_bytes"]) / n_gpus
        free = util * float(m.memory_bytes) - held
        return float(max(0.0, free) // (bpt * block) * block), "memory share after the weights (upper bound)"
    return math.nan, "unknown"


def predict(facts: Mapping[str, Any], engine: str, args: Mapping[str, Any], m: Machine, *, input_tokens: int,
            output_tokens: int, concurrency: Sequence[int], slo: Mapping[str, Any] | None = None,
            identical: bool = False, n_gpus: int = 1, speculative: bool = False, waves: bool = False,
            ties: str | None = None, engine_terms: bool = True, layout: Any = None, band: bool = True) -> dict[str, Any]:
    """Every prediction for one request shape: c=1 TPOT, TPOT at each concurrency, prefill tok/s,
    TTFT at c=1 (the engine's request cost and its prefill steps), the KV-limited concurrency and the
    capacity at the SLO, each labelled estimate or bound, with the inputs it used and the engine terms it
    paid (`engine_terms=False`: none, the base a term is fitted on). `layout` (`engines.Layout`; else
    `n_gpus` tensor-parallel GPUs): how the engine spreads over GPUs (`perfmodel_parallel`); the figures are
    per replica but for TPOT at c (the concurrency split over the replicas), the KV-limited concurrency and
    the capacity (all replicas). `ties`: why dummy weights route every token to the same experts (their
    prompts' too). `band`: the estimates' uncertainty band (`analysis.transfer.band_entries`)."""
    prof = engines.get(engine)
    par = parallel_for(layout, n_gpus, m.collective)
    n_gpus, reps = (par.tp, par.replicas) if par else (1, 1)
    slo = dict(slo or {})
    mode = mode_of(engine, args)
    counts = layer_counts(facts)
    kv_dtype = str(get_flag(args, "kv-cache-dtype") or "auto")
    kv_dtype = "auto" if kv_dtype in ("auto", "bfloat16", "bf16") else kv_dtype
    n_in, n_out = float(input_tokens), float(output_tokens)
    kv_bpt = float(kv_read_bytes_per_token(facts, n_in + n_out / 2.0, kv_dtype, n_gpus))  # what a step reads
    fixed, gpu_fixed, fixed_src, own_fixed = m.fixed(engine, mode, counts)
    kv_tok, kv_from = kv_tokens(engine, facts, args, m, n_gpus, kv_dtype, par)
    paid = (terms.step_terms(engine, args, facts, m.entry["machine"].get("name"), kv_tok, kv_dtype)
            if engine_terms else [])
    extra = sum(t["seconds"] for t in paid if t["seconds"] == t["seconds"])
    moe_pre = terms.moe_prefill(m.entry, engine) if facts.get("num_experts") else None
    pre = {"graph_tokens": prof.graph_prefill_tokens(args, facts.get("model_type")) if m.kind == "gpu" else None,
           "chunk": prof.prefill_chunk_tokens(args, m.memory_bytes) if m.kind == "gpu" else None,
           "ties": bool(ties)}
    req_s, req_src = m.request(engine)
    par_why = par.bound_because(facts) if par else []
    kind = ESTIMATE if (own_fixed and not par_why and not speculative and fixed is not None) else BOUND
    kind = kind if m.own and all(t["seconds"] == t["seconds"] for t in paid) else BOUND
    why_bound = [w for w, cond in (
        (f"calibrated on another machine of this kind ({m.label})", not m.own),
        (f"{fixed_src}: not {engine}'s own {mode} calibration", not own_fixed),
        *((w, True) for w in par_why),
        ("speculative decoding is not modelled (one token per step)", speculative),
        ("linear-attention / SSM layers are not calibrated (costed as attention layers)",
         bool((facts.get("kv_layers") or {}).get("linear_attention"))),
        ("an engine term needs the KV pool's size, which is unknown",
         any(t["seconds"] != t["seconds"] for t in paid))) if cond]
    t_pre_parts = prefill_step(m, engine, mode, facts, n_in, n_gpus, par=par, **pre)
    t_pre = t_pre_parts["total_s"]
    _, _, own_eager = m.eager_cpu(engine, counts)
    needs_eager = t_pre_parts["how"] == "launched"
    ttft_why = [w for w, cond in (
        (f"{req_src}", req_s is None),
        (f"the prompt's {n_in:g} tokens run without captured graphs, and {engine}'s own eager launch costs are not "
         "calibrated", needs_eager and not own_eager),
        ("eager mode: its TTFT was not checked against a measurement", mode == "eager"),
        *((w, True) for w in why_bound)) if cond]
    ttft_kind = ESTIMATE if not ttft_why and m.kind == "gpu" else BOUND
    ttft = (req_s or 0.0) + t_pre
    cs = sorted({int(c) for c in concurrency} | {1})
    tp = {str(c): replicas_tpot(reps, c, lambda x: tpot(m, engine, mode, facts, x, n_in, n_out, kv_bpt, identical,
                                                            n_gpus, waves, extra, par, pre)) for c in cs}
    per_request = n_in + n_out
    c_kv = kv_tok / per_request if kv_tok == kv_tok else math.nan
    seqs = get_flag(args, "max-num-seqs") or get_flag(args, "max-running-requests") or (
        prof.default_max_running(m.memory_bytes) if m.kind == "gpu" else None)  # the engine's default on this GPU
    limits = {"kv": math.floor(c_kv) if c_kv == c_kv else 4096, "max-num-seqs": int(seqs) if seqs else 4096}  # a replica's
    if reps > 1:  # every replica its own KV pool
        kv_tok, c_kv = kv_tok * reps, c_kv * reps
    cap = _capacity(m, engine, mode, facts, n_in, n_out, kv_bpt, identical, n_gpus, min(limits.values()), slo, ttft,
                    extra, par, pre)
    bw1, bw_src = m.bandwidth(engine, 1)
    f_pre, f_src = m.flops(_precision(facts), n_in)
    inputs = [
        {"name": "hardware", "value": m.label, "source": (m.entry.get("source") or "")},
        {"name": "decode bandwidth at batch 1 (B/s)", "value": bw1, "source": bw_src},
        {"name": f"GEMM FLOP/s at {n_in:g} rows", "value": f_pre, "source": f_src},
        {"name": "engine CPU side per decode step (s)", "value": fixed, "source": fixed_src},
        {"name": "GPU fixed time per decode step (s)", "value": gpu_fixed,
         "source": "CUDA-graph calibration models deep enough to rise above the CPU side's floor"},
        {"name": "layers by kind", "value": counts, "source": "model facts (config.json)"},
        {"name": "weight bytes read at c=1", "value": par.weight_bytes(facts, 1) if par else weight_bytes(facts, 1),
         "source": "model facts: non-expert weights + the experts one token touches"},
        {"name": "KV bytes read per token of context", "value": kv_bpt, "source": f"model facts, kv-cache-dtype {kv_dtype}"},
        {"name": "engine terms per decode step (s)", "value": extra,
         "source": "; ".join(f"{t['id']}: {t['source']}" for t in paid) or "none applies (data/engine_terms.yaml)"},
        {"name": "MoE prefill term", "value": moe_pre, "source": (moe_pre or {}).get("source") or "not calibrated"},
        {"name": "request cost (s)", "value": req_s, "source": req_src},
        {"name": "host factor (CPU-side terms x)", "value": m.scale_host,
         "source": m.host["source"] or "the calibration's own host"},
        {"name": "prefill steps", "value": {k: t_pre_parts[k] for k in ("chunks", "how", "gpu_s", "cpu_s")},
         "source": f"{engine}: graphs up to {pre['graph_tokens']} tokens, chunks of {pre['chunk']} (engine profile)"},
        {"name": "model facts", "value": facts.get("architecture"),
         "source": facts.get("facts_source") or "run record (counted before the library did)"},
        {"name": "identical requests (route as one token)", "value": identical,
         "source": ties or "workload: the same prompt for every request, decoded deterministically (temperature 0 "
                           "or a fixed seed)"},
        {"name": "GPUs", "value": par.gpus if par else 1, "source": "tensor x pipeline parallel flags"},
        {"name": "requests in waves (their prefills at a wave's start)", "value": waves,
         "source": "workload: a closed loop whose requests all have one forced length (ignore_eos) start and end "
                   "together; otherwise each prefill rides in the running requests' decode steps"},
        *({"name": f"transferred: {t['term']}", "value": t.get("value"), "source": f"{t['rule']} ({t['source']})"}
          for t in m.transfer),
        *(par.inputs() if par else []),
    ]
    out = {
        "input_tokens": int(input_tokens), "output_tokens": int(output_tokens), "mode": mode,
        "c1_tpot_s": tp["1"], "tpot_s": tp, "ttft_c1_s": ttft, "prefill_tok_s": n_in / t_pre if t_pre > 0 else math.nan,
        "kv_tokens": kv_tok, "kv_from": kv_from, "kv_limited_concurrency": c_kv,
        "max_num_seqs": int(seqs) if seqs else None, **cap,
        "kinds": {"c1_tpot_s": kind, "tpot_s": kind, "prefill_tok_s": ttft_kind, "ttft_c1_s": ttft_kind,
                  "kv_limited_concurrency": BOUND if "upper bound" in kv_from else ESTIMATE, "capacity_rps": kind},
        "bound_because": why_bound, "ttft_bound_because": ttft_why, "inputs": inputs,
        "engine_terms": [{k: t[k] for k in ("id", "seconds", "source")} for t in paid],
        "transferred_from": m.transferred_from,
    }
    if band and ESTIMATE in (kind, ttft_kind):
        out["band"] = _band(facts, engine, args, m, input_tokens=input_tokens, output_tokens=output_tokens,
                            concurrency=concurrency, slo=slo, identical=identical, n_gpus=n_gpus, speculative=speculative,
                            waves=waves, ties=ties, engine_terms=engine_terms, layout=layout)
    return out


def _band(facts: Mapping[str, Any], engine: str, args: Mapping[str, Any], m: Machine, **kw: Any) -> dict[str, Any]:
    """The estimates' band: the prediction again with every uncertain term at its favourable end and at
    its unfavourable one (`analysis.transfer.band_entries`): the transferred terms by their rules' ranges,
    the host's floor by its spread over the calibration models, its eager costs, its request cost's residuals."""
    from .transfer import band_entries

    ends = []
    for e, host_end in zip(band_entries(m.entry), m.host["range"]):
        mm = Machine(e, own=m.own, memory_bytes=m.memory_bytes, scale_host=m.scale_host * host_end)
        ends.append(predict(facts, engine, args, mm, band=False, **kw))
    lo, hi = ends
    return {"c1_tpot_s": [lo["c1_tpot_s"], hi["c1_tpot_s"]],
            "tpot_s": {c: [lo["tpot_s"][c], hi["tpot_s"][c]] for c in lo["tpot_s"]},
            "ttft_c1_s": [lo["ttft_c1_s"], hi["ttft_c1_s"]],
            "rule": "every uncertain term at its favourable, then its unfavourable end: "
                    + ("; ".join(f"{t['term']} +/-{t['range'] * 100:.0f} %" for t in m.transfer if t.get("range"))
                       or "no term transferred")
                    + "; the host's CUDA-graph floor over its calibration models' spread, its eager costs +/-10 %, "
                      "its request cost over its residuals' quartiles"
                    + (f"; the host factor x{m.host['range'][0] * m.scale_host:.2f} to x{m.host['range'][1] * m.scale_host:.2f}"
                       if m.host["range"] != (1.0, 1.0) else "")}


def _capacity(m: Machine, engine: str, mode: str, facts: Mapping[str, Any], n_in: float, n_out: float, kv_bpt: float,
              identical: bool, n_gpus: int, c_max: int, slo: Mapping[str, Any], t_pre: float,
              extra: float = 0.0, par: Parallel | None = None, pre: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The most concurrent requests whose TPOT and TTFT (one prefill after the running step) meet
    the SLO, as a request rate by Little's law (`c_max` and the search per replica; the rate and the
    concurrency of all replicas)."""
    one = _capacity_one(m, engine, mode, facts, n_in, n_out, kv_bpt, identical, n_gpus, c_max, slo, t_pre, extra, par,
                        pre)
    reps = par.replicas if par else 1
    if reps > 1 and one["capacity_concurrency"] is not None:
        one.update(capacity_rps=one["capacity_rps"] * reps, capacity_concurrency=one["capacity_concurrency"] * reps)
    return one


def _capacity_one(m: Machine, engine: str, mode: str, facts: Mapping[str, Any], n_in: float, n_out: float,
                  kv_bpt: float, identical: bool, n_gpus: int, c_max: int, slo: Mapping[str, Any], t_pre: float,
                  extra: float, par: Parallel | None, pre: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """`_capacity` of one replica."""
    tpot_t, ttft_t = slo.get("tpot_p95_s"), slo.get("ttft_p95_s")
    if not (tpot_t or ttft_t):
        return {"capacity_rps": math.nan, "capacity_concurrency": None, "capacity_binding": "no SLO"}
    best, binding = None, "kv" if c_max < 4096 else "search limit"
    c = 1
    while c <= max(1, c_max):
        t = tpot(m, engine, mode, facts, c, n_in, n_out, kv_bpt, identical, n_gpus, extra_s=extra, par=par, pre=pre)
        ttft = t_pre + step_time(m, engine, mode, facts, batch=c, ctx=n_in + n_out / 2, kv_bpt=kv_bpt,
                                 distinct=1 if identical else c, n_gpus=n_gpus, extra_s=extra, par=par)["total_s"]
        if (tpot_t and t > tpot_t) or (ttft_t and ttft > ttft_t):
            binding = "tpot" if tpot_t and t > tpot_t else "ttft"
            break
        best = (c, t, ttft)
        c = c + 1 if c < 16 else int(c * 1.1) + 1
    if best is None:
        return {"capacity_rps": 0.0, "capacity_concurrency": 0, "capacity_binding": binding}
    c, t, ttft = best
    return {"capacity_rps": c / (ttft + n_out * t), "capacity_concurrency": c, "capacity_binding": binding,
            "capacity_tpot_s": t, "capacity_ttft_s": ttft}


def identical_requests(workload: Any) -> bool:
    """Whether every request of the workload is the same and decoded deterministically: calibrated
    filler prompts (the same text for every request of a bucket) at temperature 0 or with a fixed
    seed. Such requests emit the same token at every step, so a batch of them routes as one token."""
    filler = all(b.source == "filler" and not b.shared_prefix and not b.prefix_reuse for b in workload.buckets)
    return bool(filler and (float(workload.temperature or 0) == 0 or workload.seed is not None))


def router_ties(run: Mapping[str, Any]) -> str | None:
    """Why every token of a batch routes to the same experts whatever the requests, or None: a run
    with dummy weights on an engine version whose router ties them (`EngineProfile.dummy_router_ties`)."""
    ep = run.get("engine_params") or {}
    if ep.get("load_format") != "dummy":
        return None
    cfg = (run.get("model") or {}).get("config") or {}
    kind = ep.get("kind", "vllm")
    version = (run.get("server") or {}).get("version") or (run.get("packages") or {}).get(kind) or ""
    return engines.get(kind).dummy_router_ties(cfg, version)


def in_waves(workload: Any) -> bool:
    """Whether the workload's requests run in waves: a closed loop (concurrency arrivals) whose
    every request has one forced length (ignore_eos) and whose workers start at once (no
    `concurrency_ramp_s`), so the c requests of a round start, and end, together."""
    return (workload.arrival == "concurrency" and not workload.concurrency_ramp_s  # a ramp spreads the workers
            and all(b.source == "filler" and b.ignores_eos(workload.ignore_eos) for b in workload.buckets))


def predict_configuration(run: Mapping[str, Any], workload: Any, slo: Mapping[str, Any] | None,
                          lengths: Mapping[str, tuple[int | None, int | None]], at: str, *,
                          folder: Path | str | None = None, engine_terms: bool = True) -> dict[str, Any]:
    """prediction.json of one configuration: per bucket label, `predict` at the workload's
    concurrencies, with the machine, the model version and every input (without a calibration of
    the machine, the roofline's bounds, labelled so); or `not_predictable` with the fact that is
    missing. Written before the first request (`stages._run_record`)."""
    from ..engines import get as profile
    from ..engines.flags import engine_args

    base = {"format_version": FORMAT_VERSION, "model_version": MODEL_VERSION, "stored_before_measurement": True,
            "stored_at": at, "study": run.get("study"), "config": run.get("config")}
    facts = (run.get("model") or {}).get("facts")
    if not facts or not facts.get("param_count"):
        return {**base, "not_predictable": "the model's facts (parameter count) unknown"}
    known = {label: (int(a), int(b)) for label, (a, b) in lengths.items() if a and b}
    missing = {label: "its prompt lengths unknown before the run" for label in lengths if label not in known}
    conc = list(getattr(workload, "concurrency", None) or [1])
    m, why = machine_for(run, folder)
    if m is None:
        out = {**base, "model_version": "roofline", "machine": {"calibration": None, "why": why},
               "buckets": _roofline_bounds(run, slo, known, why, conc)}
    else:
        ep = run.get("engine_params") or {}
        engine = ep.get("kind", "vllm")
        args = engine_args(ep.get("args"))
        prof = profile(engine)
        layout, spec = prof.layout(args), prof.speculative(args)
        ties = router_ties(run)
        ident = identical_requests(workload) or bool(ties)
        out = {**base, "machine": {"calibration": m.transferred_from or m.entry.get("id"),
                                   "name": m.entry["machine"]["name"], "measured_at": m.entry.get("measured_at"),
                                   "own": m.own, "transferred_from": m.transferred_from,
                                   "transfer": m.transfer or None,
                                   "host": {"factor": m.scale_host, "how": m.host.get("how") or "calibration host",
                                            "source": m.host["source"] or "the calibration's own host"}},
               "buckets": {label: predict(facts, engine, args, m, input_tokens=n_in, output_tokens=n_out,
                                          concurrency=conc, slo=slo, identical=ident, layout=layout, speculative=spec,
                                          waves=in_waves(workload), ties=ties, engine_terms=engine_terms)
                           for label, (n_in, n_out) in known.items()}}
    if missing:
        out["not_predictable_buckets"] = missing
    if not out["buckets"]:
        out["not_predictable"] = why if m is None and known else "no bucket with known prompt and output lengths"
    return out


def _roofline_bounds(run: Mapping[str, Any], slo: Mapping[str, Any] | None, lengths: Mapping[str, tuple[int, int]],
                     why: str, concurrency: Sequence[int]) -> dict[str, Any]:
    """Without a calibration of the machine: the datasheet (or probed CPU) roofline's bounds
    (`analysis.predict`), every quantity labelled a bound, and why."""
    from .predict import hardware_of, predict_run
    from .roofline import decode_bound_s_per_token

    hw, n = hardware_of(run)
    facts = (run.get("model") or {}).get("facts") or {}
    kv = float(facts.get("kv_cache_bytes_per_token") or 0)
    per = {}
    for label, (n_in, n_out) in lengths.items():
        p = predict_run(run, n_in, n_out, slo)
        if p is None:
            continue
        tp = {str(c): decode_bound_s_per_token(weight_bytes(facts, c) / n, kv, n_in + n_out / 2, c,
                                               float(hw["memory_bandwidth_Bps"]) * n) for c in sorted(set(concurrency))}
        per[label] = {"input_tokens": n_in, "output_tokens": n_out, "c1_tpot_s": p["tpot_c1_s"],
                      "tpot_s": {**tp, "1": p["tpot_c1_s"]}, "ttft_c1_s": p["ttft_c1_s"], "prefill_tok_s": p["prefill_tps"],
                      "kv_tokens": p["kv_tokens"], "kv_from": p["kv_from"], "kv_limited_concurrency": p["kv_concurrency"],
                      "capacity_rps": p.get("capacity_rps"), "capacity_concurrency": p.get("capacity_concurrency"),
                      "capacity_binding": p.get("capacity_binding"),
                      "kinds": {k: BOUND for k in ("c1_tpot_s", "tpot_s", "prefill_tok_s", "kv_limited_concurrency",
                                                   "capacity_rps")},
                      "bound_because": [why + "; the roofline of the hardware table instead"]}
    return per


__all__ = ["BOUND", "ESTIMATE", "GEMMS_PER_LAYER", "KINDS", "MODEL_VERSION", "distinct_experts", "expert_split",
           "gemm_rate", "identical_requests", "in_waves", "prefill_compute_s", "prefill_step",
           "launched_step", "layer_counts", "mode_of", "predict", "predict_configuration", "prefill_time", "router_ties", "step_time",
           "tpot"]
