"""The quality check (every change is checked for output correctness): a configuration
answers a fixed list of prompts at temperature 0, one request at a time, and the answers, their
token ids and a task score land in the run folder as `quality.json`. The `quality` prompt set has
known answers (scored by `score_answer`); the other sets contribute their first prompts, compared
token by token against the baseline (`analysis.quality.compare`). With random weights the check
is skipped and says why: greedy text of random weights loops on one token, so agreement between
two configurations would prove nothing. Not for load (`runner`) or the comparison (`analysis`).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import httpx

from ..prompts import Prompt, load_set
from ..runfolder import QUALITY_JSON, write_json

FORMAT_VERSION = 1

SCORED_SET = "quality"  # the set with known answers, always sent in full

DUMMY_REASON = ("dummy weights: greedy text of random weights falls into a repeated-token loop, so identical "
                "outputs across configurations would prove nothing (measured on an H200 with a dummy MoE: bf16 vs "
                "fp8 KV cache gave 8 of 8 identical outputs)")


def normalize(text: str) -> str:
    """Lower case, every run of non-alphanumeric characters one space, trimmed."""
    return " ".join(re.sub(r"[^0-9a-z]+", " ", text.lower()).split())


def score_answer(output: str, expected: str) -> bool:
    """True when one of the `|`-separated answers occurs as whole words in the normalized output
    ("Paris" in "The capital of France is Paris."; "4|four" accepts either)."""
    out = f" {normalize(output)} "
    return any(f" {normalize(alt)} " in out for alt in expected.split("|") if normalize(alt))


def selected_prompts(sets: Iterable[str], prompts_per_set: int = 1) -> list[tuple[str, Prompt]]:
    """(set, prompt) in the order they are sent: the scored set in full, others' first prompts."""
    out: list[tuple[str, Prompt]] = []
    for name in sets:
        ps = load_set(name)
        chosen = ps.prompts if name == SCORED_SET else ps.prompts[:prompts_per_set]
        out += [(name, p) for p in chosen]
    return out


def _answer(client: httpx.Client, base_url: str, model: str, prompt: Prompt, max_tokens: int,
            seed: int | None) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "messages": prompt.chat(), "temperature": 0.0, "max_tokens": max_tokens,
                            "return_token_ids": True}  # vLLM >= 0.11: the output's token ids on the choice
    if seed is not None:
        body["seed"] = seed
    r = client.post(base_url.rstrip("/") + "/v1/chat/completions", json=body)
    r.raise_for_status()
    choice = r.json()["choices"][0]
    text = choice["message"].get("content") or ""
    ids = choice.get("token_ids")
    if ids is None:  # an engine without return_token_ids: its /tokenize of the text
        t = client.post(base_url.rstrip("/") + "/tokenize", json={"model": model, "prompt": text,
                                                                  "add_special_tokens": False})
        ids = t.json().get("tokens") if t.status_code == 200 else None
    return {"output_text": text, "output_token_ids": [int(i) for i in ids] if ids is not None else None,
            "finish_reason": choice.get("finish_reason")}


def run_quality(base_url: str, model: str, *, sets: Iterable[str] = (SCORED_SET,), prompts_per_set: int = 1,
                max_tokens: int = 128, headers: Mapping[str, str] | None = None, measurable: bool = True,
                reason: str | None = None, seed: int | None = 42, timeout_s: float = 300.0,
                out_dir: Path | None = None) -> dict[str, Any]:
    """Answer the selected prompts at temperature 0, one at a time; returns the quality.json
    object and, with `out_dir`, writes it there. `measurable=False` sends nothing and records
    `reason` (dummy weights). Raises httpx.HTTPError when the server fails a request."""
    t0_s = time.monotonic()
    rows: list[dict[str, Any]] = []
    if measurable:
        with httpx.Client(timeout=timeout_s, headers=dict(headers or {})) as client:
            for name, p in selected_prompts(sets, prompts_per_set):
                a = _answer(client, base_url, model, p, max_tokens, seed)
                correct = score_answer(a["output_text"], p.expected) if p.expected is not None else None
                rows.append({"id": p.id, "set": name, **a, "expected": p.expected, "correct": correct})
    scored = [r for r in rows if r["correct"] is not None]
    q = {"format_version": FORMAT_VERSION, "measurable": bool(measurable), "reason": None if measurable else reason,
         "prompts": rows, "score": {"correct": sum(1 for r in scored if r["correct"]), "total": len(scored)},
         "max_tokens": max_tokens, "elapsed_s": round(time.monotonic() - t0_s, 3)}
    if out_dir is not None:
        write_json(Path(out_dir) / QUALITY_JSON, q)
    return q
