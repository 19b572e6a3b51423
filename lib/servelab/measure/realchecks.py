"""Real-weights checks on a running vLLM server, run instead of a configuration's workload (params `checks:`):

  quality      every prompt of the `quality` set plus the first SUBSET prompts of each other set, one request at a
               time, temperature 0, seed 42, stop at end-of-sequence (max_tokens cap), the output token ids kept
               (vLLM's return_token_ids) -> quality.json (scoring: the expected answer as whole words in the
               lower-cased output, punctuation removed)
  speculative  the copy-heavy `rewrite` set and the free-generation `questions` set, streamed at each concurrency,
               stop at end-of-sequence; /metrics read before and after each (set, concurrency) -> speculative.jsonl:
               output tokens, wall time, TTFT and inter-token gaps, and the deltas of vLLM's spec_decode counters
               (drafts, draft tokens, accepted tokens, accepted per draft position)

Their write-up is `report.checks`. Not for the quality stage every configuration runs (`measure.quality`).
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from ..prompts import Prompt, list_sets, load_set

SEED = 42
SUBSET = 3  # prompts taken from each non-quality set for the quality check
COUNTERS = ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
            "vllm:spec_decode_num_accepted_tokens_total")
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"


def normalize(text: str) -> str:
    return " ".join(re.sub(r"[^\w\s]", " ", text.lower()).split())


def correct(output: str, expected: str | None) -> bool | None:
    """Whether one of the expected answers ('a|b') stands as whole words in the output (None: no answer known)."""
    if expected is None:
        return None
    words = f" {normalize(output)} "
    return any(f" {normalize(alt)} " in words for alt in expected.split("|") if normalize(alt))


def metrics(client: httpx.Client, url: str) -> dict[str, float]:
    """The spec-decode counters of /metrics (summed over label sets; per position keyed pos<N>)."""
    out: dict[str, float] = {}
    for line in client.get(url + "/metrics", timeout=20).text.splitlines():
        if line.startswith("#") or not line.startswith("vllm:spec_decode"):
            continue
        name_labels, _, value = line.rpartition(" ")
        name = name_labels.split("{", 1)[0]
        if name == PER_POS:
            m = re.search(r'position="(\d+)"', name_labels)
            key = f"pos{m.group(1)}" if m else "pos?"
        elif name in COUNTERS:
            key = name
        else:
            continue
        out[key] = out.get(key, 0.0) + float(value)
    return out


def quality(client: httpx.Client, url: str, model: str, max_tokens: int) -> dict[str, Any]:
    t0 = time.monotonic()
    chosen = [("quality", p) for p in load_set("quality").prompts]
    for name in list_sets():
        if name != "quality":
            chosen += [(name, p) for p in load_set(name).prompts[:SUBSET]]
    rows = []
    for set_name, p in chosen:
        body = {"model": model, "messages": p.chat(), "temperature": 0, "seed": SEED, "max_tokens": max_tokens,
                "return_token_ids": True}
        r = client.post(url + "/v1/chat/completions", json=body, timeout=120)
        r.raise_for_status()
        ch = r.json()["choices"][0]
        text = ch["message"].get("content") or ""
        rows.append({"id": p.id, "set": set_name, "output_text": text, "output_token_ids": ch.get("token_ids") or [],
                     "finish_reason": ch.get("finish_reason"), "expected": p.expected,
                     "correct": correct(text, p.expected)})
    scored = [r for r in rows if r["correct"] is not None]
    return {"format_version": 1, "measurable": True, "reason": None, "prompts": rows,
            "score": {"correct": sum(bool(r["correct"]) for r in scored), "total": len(scored)},
            "elapsed_s": round(time.monotonic() - t0, 3), "max_tokens": max_tokens, "seed": SEED}


def stream_one(client: httpx.Client, url: str, model: str, p: Prompt, max_tokens: int) -> dict[str, Any]:
    body = {"model": model, "messages": p.chat(), "temperature": 0, "seed": SEED, "max_tokens": max_tokens,
            "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.monotonic()
    stamps: list[float] = []
    usage: dict[str, Any] = {}
    with client.stream("POST", url + "/v1/chat/completions", json=body, timeout=300) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if ev.get("usage"):
                usage = ev["usage"]
            for ch in ev.get("choices") or []:
                if (ch.get("delta") or {}).get("content"):
                    stamps.append(time.monotonic() - t0)
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    return {"id": p.id, "start_s": t0, "e2e_s": time.monotonic() - t0, "ttft_s": stamps[0] if stamps else None,
            "chunks": len(stamps), "mean_gap_s": sum(gaps) / len(gaps) if gaps else None,
            "prompt_tokens": usage.get("prompt_tokens"), "output_tokens": usage.get("completion_tokens")}


def speculative(client: httpx.Client, url: str, model: str, names: Sequence[str], concurrency: Sequence[int],
                max_tokens: int) -> list[dict[str, Any]]:
    out = []
    for name in names:
        ps = load_set(name)
        for c in concurrency:
            stream_one(client, url, model, ps.prompts[0], 16)  # warm-up (not counted: before the first read)
            before = metrics(client, url)
            results: list[dict[str, Any]] = []
            lock = threading.Lock()
            queue = list(ps.prompts)

            def worker() -> None:
                while True:
                    with lock:
                        if not queue:
                            return
                        p = queue.pop(0)
                    res = stream_one(client, url, model, p, max_tokens)
                    with lock:
                        results.append(res)

            t0 = time.monotonic()
            threads = [threading.Thread(target=worker) for _ in range(c)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            wall = time.monotonic() - t0
            after = metrics(client, url)
            delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in sorted(set(after) | set(before))}
            toks = sum(r["output_tokens"] or 0 for r in results)
            out.append({"set": name, "kind": ps.kind, "concurrency": c, "requests": len(results),
                        "output_tokens": toks, "wall_s": wall, "output_tps": toks / wall if wall else None,
                        "counters": delta, "requests_detail": sorted(results, key=lambda r: r["id"])})
    return out


def run_checks(url: str, out: Path, checks: Sequence[str], *, concurrency: Sequence[int] = (1, 8),
               max_tokens: int = 256, sets: Sequence[str] = ("rewrite", "questions")) -> list[str]:
    """The checks named, against the server at `url`, into the run folder `out`; one line per check."""
    out.mkdir(parents=True, exist_ok=True)
    url = url.rstrip("/")
    lines = []
    with httpx.Client() as client:
        model = client.get(url + "/v1/models", timeout=20).json()["data"][0]["id"]
        if "speculative" in checks:  # first: timed, while nothing else runs on the GPU
            rows = speculative(client, url, model, sets, concurrency, max_tokens)
            (out / "speculative.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            for r in rows:
                acc, drafted = r["counters"].get(COUNTERS[2], 0.0), r["counters"].get(COUNTERS[1], 0.0)
                lines.append(f"speculative {r['set']} c={r['concurrency']}: {r['output_tokens']} tokens in "
                             f"{r['wall_s']:.1f} s ({r['output_tps']:.0f} tok/s), accepted {acc:.0f}/{drafted:.0f} drafted")
        if "quality" in checks:
            q = quality(client, url, model, max_tokens)
            (out / "quality.json").write_text(json.dumps(q, indent=1) + "\n")
            lines.append(f"quality: {q['score']['correct']}/{q['score']['total']} correct, {len(q['prompts'])} prompts, "
                         f"{q['elapsed_s']:.1f} s")
    return lines


__all__ = ["COUNTERS", "correct", "metrics", "quality", "run_checks", "speculative"]
