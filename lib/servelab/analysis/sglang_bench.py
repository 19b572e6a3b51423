"""SGLang's own benchmark (``python3 -m sglang.bench_serving``) as a peer: the command that runs it
against a server with fixed-length random prompts, and its JSON-lines result (read by the caller:
`results.peers`, `results.formats`) as servelab's record rows (the columns of the vLLM/GuideLLM importers), so ``summary.summarize``
and the peer tables work on it.

Result shape (SGLang 0.5.16, ``sglang/benchmark/serving.py``; ``sglang/bench_serving.py`` is a
deprecated shim that imports it): ``benchmark()`` appends one JSON object per run to
``--output-file`` (``file.write(json.dumps(result_for_dump) + "\\n")``), the summary ``result``
(tag, backend, dataset_name, request_rate (``Infinity`` for all-at-once), max_concurrency,
random_input_len, random_output_len, random_range_ratio, server_info (its ``/server_info``),
duration, completed, total_input_tokens, total_output_tokens, request/input/output_throughput,
{mean,median,std,p90,p95,p99}_{e2e_latency,ttft,tpot,itl}_ms, concurrency, accept_length,
max_output_tokens_per_s, max_concurrent_requests) merged with, under ``--output-details`` only,
the per-request lists ``input_lens``, ``output_lens``, ``ttfts``, ``itls``, ``generated_texts``,
``errors``. Several runs appended to one file become rounds 0, 1, ... here (`sglang_bench_frame`).

How their per-request numbers map (``async_request_openai_chat_completions`` for
``--backend sglang-oai-chat``):
- ttft_s = ``ttfts[i]``: request start -> first chunk whose delta has content (or reasoning
  content); the role-only first chunk does not count, as in servelab.
- chunk_times_s = ttft + cumulative ``itls[i]`` (one gap per later content chunk), so servelab's
  pooled ITL is theirs; e2e_s = the last content chunk. Their ``latency`` (also stopped at
  ``[DONE]``) is not saved per request, so e2e_s is short of theirs by that tail (< 1 ms).
- output_tokens = ``output_lens[i]``: the stream's ``usage.completion_tokens`` when the server
  sent one, else the requested length (bench_serving sets no ``stream_options``); 0 for failures.
  With ``ignore_eos`` (their default) and ``--random-range-ratio 1`` it is the requested length.
- prompt_tokens = ``input_lens[i]``: their dataset's count (``--random-input-len`` minus
  ``tokenizer.num_special_tokens_to_add()``), not the server's: the chat template adds tokens
  and decoded random ids may re-tokenize differently. servelab's own client reports usage.
- ok = ``errors[i] == ""``. No start times are saved: start_s = 0, end_s = duration for every
  request (``times_reconstructed``), so the aggregate output tok/s is their output_throughput.
Not for running it (the study runner, `lanes`, runs the peer tools on a configuration's server) or for their headline table
(``sglang_bench_reported`` returns it).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..schema.runfiles import RequestRecord

SGLANG_BENCH = "sglang.bench_serving"

def sglang_bench_command(base_url: str, model_dir: str | Path, input_len: int, output_len: int, concurrency: int,
                         num_prompts: int, out_file: str | Path, seed: int = 42, *, python: str = "python3",
                         backend: str = "sglang-oai-chat", warmup_requests: int = 1) -> list[str]:
    """argv of one SGLang benchmark run: ``num_prompts`` chat requests of exactly ``input_len``
    random-id prompt tokens (before the chat template) and ``output_len`` output tokens, at most
    ``concurrency`` in flight, all released at once (``--request-rate inf``, their default).

    Fixed lengths: ``--random-range-ratio 1`` (lengths drawn from [len * ratio, len]), and EOS is
    ignored because ``--disable-ignore-eos`` is NOT passed (``ignore_eos = not
    args.disable_ignore_eos``). ``random-ids`` draws token ids from the tokenizer, no ShareGPT
    download. ``base_url`` is the server root (``.../v1`` is stripped; they append the path).
    ``--model`` is the served model name, by default SGLang's ``--model-path``; the tokenizer is
    read from the same directory. Their one warmup request is not in the result file.
    """
    root = str(base_url).rstrip("/").removesuffix("/v1")
    return [python, "-m", "sglang.bench_serving", "--backend", backend, "--base-url", root,
            "--model", str(model_dir), "--tokenizer", str(model_dir),
            "--dataset-name", "random-ids", "--random-input-len", str(int(input_len)),
            "--random-output-len", str(int(output_len)), "--random-range-ratio", "1",
            "--num-prompts", str(int(num_prompts)), "--max-concurrency", str(int(concurrency)),
            "--request-rate", "inf", "--seed", str(int(seed)), "--warmup-requests", str(int(warmup_requests)),
            "--output-file", str(out_file), "--output-details", "--disable-tqdm"]


def _rate(v: Any) -> float:
    if v is None or v in ("inf", "trace") or (isinstance(v, float) and math.isinf(v)):
        return 0.0  # all at once (closed loop under --max-concurrency): servelab's rate_rps 0
    return float(v)


def sglang_bench_rows(res: dict[str, Any], *, config: str, bucket_label: str | None = None, round_: int = 0,
                      seq0: int = 0) -> list[dict[str, Any]]:
    """Records of one bench_serving result object (see the module docstring for the mapping)."""
    if "ttfts" not in res:
        raise ValueError("sglang.bench_serving result has no per-request data: run it with --output-details")
    ttfts, n = res["ttfts"], len(res["ttfts"])
    itls = res.get("itls") or [[] for _ in range(n)]
    ins = res.get("input_lens") or [None] * n
    outs = res.get("output_lens") or [None] * n
    errors = res.get("errors") or ["" if o else "failed" for o in outs]
    ok_idx = [i for i in range(n) if not errors[i]]
    tin = int(res.get("random_input_len") or np.median([ins[i] or 0 for i in ok_idx] or [0]))
    tout = int(res.get("random_output_len") or np.median([outs[i] or 0 for i in ok_idx] or [0]))
    conc = int(res.get("max_concurrency") or n)
    dur = float(res.get("duration") or 0.0)
    rows = []
    for i in range(n):
        ok = not errors[i]
        chunk_times = (np.float64(ttfts[i]) + np.concatenate([[0.0], np.cumsum(itls[i])])).tolist() if ok else []
        ttft = float(ttfts[i]) if ok else None
        e2e = chunk_times[-1] if ok else None
        out = int(outs[i]) if ok and outs[i] is not None else None
        per: dict[str, Any] = {"decode_tps": None, "e2e_output_tps": None, "tpot_s": None}
        if out and e2e:
            per["e2e_output_tps"] = out / e2e
        if out and out > 1 and ttft is not None and e2e is not None and e2e > ttft:
            per["decode_tps"] = (out - 1) / (e2e - ttft)
            per["tpot_s"] = 1.0 / per["decode_tps"]
        rows.append({
            "config": config, "bucket": bucket_label or f"in{tin}-out{tout}", "target_input_tokens": tin,
            "target_output_tokens": tout, "concurrency": conc, "rate_rps": _rate(res.get("request_rate")),
            "round": round_, "warmup": False, "seq": seq0 + i, "ok": ok,
            "error_kind": None if ok else "peer_error", "error_detail": None if ok else str(errors[i])[-600:],
            "ttft_s": ttft, "e2e_s": e2e, "prompt_tokens": ins[i], "output_tokens": out, **per,
            "chunk_times_s": chunk_times, "start_s": 0.0, "end_s": dur, "tool": SGLANG_BENCH,
            "times_reconstructed": True,
        })
    return rows


def sglang_bench_frame(objs: Iterable[dict[str, Any]], *, config: str, bucket_label: str | None = None) -> pd.DataFrame:
    """The lines of ``sglang.bench_serving --output-file X.jsonl --output-details`` -> servelab-shaped
    records, one row per request; each line (one run) is a round."""
    rows: list[dict[str, Any]] = []
    for rnd, obj in enumerate(objs):
        rows += sglang_bench_rows(obj, config=config, bucket_label=bucket_label, round_=rnd, seq0=len(rows))
    return pd.DataFrame(rows, columns=RequestRecord.peer_columns())


def sglang_bench_reported(res: dict[str, Any]) -> dict[str, Any]:
    """SGLang's own headline numbers of one run (one line of the result file; their definitions:
    TPOT = (latency - ttft) / (output - 1) with latency to ``[DONE]``), in servelab's units."""
    ms = lambda k: res[k] / 1000 if res.get(k) is not None else None  # noqa: E731
    info = res.get("server_info") or {}
    return {"completed": res.get("completed"), "duration_s": res.get("duration"),
            "max_concurrency": res.get("max_concurrency"), "ttft_p50_s": ms("median_ttft_ms"),
            "ttft_p95_s": ms("p95_ttft_ms"), "tpot_p50_s": ms("median_tpot_ms"), "itl_p50_s": ms("median_itl_ms"),
            "e2e_p50_s": ms("median_e2e_latency_ms"), "output_tps": res.get("output_throughput"),
            "total_output_tokens": res.get("total_output_tokens"), "server_version": info.get("version")}
