"""Ask a running MoE engine which experts its router chose (`--enable-return-routed-experts`): n concurrent
non-streaming chat requests of filler prompts, decoded together, their `routed_experts` fields kept
(`analysis.routing` counts the distinct experts per decode step). vLLM answers in each choice's
`routed_experts`; an engine that returns none (the flag off, or an engine whose field is not read here) gives
an error that says so. Not for the benchmark's timing (`measure.runner`)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx



async def _one(client: httpx.AsyncClient, url: str, model: str, prompt: str, output: int, headers: dict[str, str]) -> dict:
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": output,
            "temperature": 1.0, "ignore_eos": True, "stream": False}
    r = await client.post(f"{url.rstrip('/')}/v1/chat/completions", json=body, headers=headers)
    r.raise_for_status()
    return r.json()


async def _all(url: str, model: str, prompts: list[str], output: int, headers: dict[str, str], timeout_s: float) -> list[dict]:
    async with httpx.AsyncClient(timeout=timeout_s) as client:
        return await asyncio.gather(*(_one(client, url, model, p, output, headers) for p in prompts))


def probe(url: str, model: str, *, concurrency: int, prompt_text: str, output: int,
          headers: dict[str, str] | None = None, timeout_s: float = 300.0) -> list[dict[str, Any]]:
    """Each request's (prompt tokens, routed_experts base64) from `concurrency` requests sent at once; each
    prompt its own (a distinct number first), so the requests' tokens differ as real traffic's do."""
    prompts = [f"{i} {prompt_text}" for i in range(concurrency)]
    answers = asyncio.run(_all(url, model, prompts, output, headers or {}, timeout_s))
    out = []
    for a in answers:
        ch = (a.get("choices") or [{}])[0]
        b64 = ch.get("routed_experts")
        if not b64:
            raise ValueError("the server returned no routed_experts: start it with --enable-return-routed-experts "
                             "(vLLM; its responses carry them)")
        out.append({"prompt_tokens": int((a.get("usage") or {}).get("prompt_tokens") or 0), "routed_experts": b64})
    return out


def filler(words: int, text: str = "This is deterministic benchmark input text.") -> str:
    """`words` words of the workload's filler text, repeated (about a token a word)."""
    base = text.split()
    return " ".join((base * (words // len(base) + 1))[:words])


__all__ = ["filler", "probe"]
