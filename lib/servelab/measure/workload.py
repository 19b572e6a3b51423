"""Prompts that hit an exact input-token count after the chat template.

A prompt is the filler sentence repeated (by default "This is deterministic benchmark input
text."), cut to a number of words found by an exponential then a binary search against a
token counter: the server's `/tokenize` when it has one, else a local tokenizer with the
same chat template. Single-character words then close the last gap. Not for: sending load.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol

import httpx

PAD_WORD = " a"


class TokenCounter(Protocol):
    name: str

    def count(self, prompt: str) -> int: ...

    def count_text(self, text: str) -> int: ...


class ServerTokenizer:
    """Counts prompt tokens with the server's /tokenize (chat template applied for api=chat)."""

    name = "server /tokenize"

    def __init__(self, base_url: str, model: str, api: str = "chat", headers: dict[str, str] | None = None,
                 chat_template_kwargs: dict | None = None) -> None:
        self.url = base_url.rstrip("/") + "/tokenize"
        self.model, self.api = model, api
        self.client = httpx.Client(timeout=30.0, headers=headers or {})
        self.chat_template_kwargs = chat_template_kwargs

    def count(self, prompt: str) -> int:
        if self.api == "chat":
            body = {"model": self.model, "messages": [{"role": "user", "content": prompt}],
                    "add_generation_prompt": True}
            if self.chat_template_kwargs:
                body["chat_template_kwargs"] = self.chat_template_kwargs
        else:
            body = {"model": self.model, "prompt": prompt}
        r = self.client.post(self.url, json=body)
        r.raise_for_status()
        return int(r.json()["count"])

    def count_text(self, text: str) -> int:
        """Tokens of generated text as it stands (no template, no special tokens): the output
        count of a server that streams no usage."""
        r = self.client.post(self.url, json={"model": self.model, "prompt": text, "add_special_tokens": False})
        r.raise_for_status()
        return int(r.json()["count"])

    def available(self) -> bool:
        try:
            self.count("hello")
            return True
        except (httpx.HTTPError, KeyError, ValueError):
            return False


class LocalTokenizer:
    """Counts tokens with a local tokenizer directory (transformers), chat template applied."""

    name = "local tokenizer"

    def __init__(self, tokenizer_dir: str | Path, api: str = "chat", chat_template_kwargs: dict | None = None) -> None:
        from transformers import AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
        self.api = api
        self.kwargs = chat_template_kwargs or {}

    def count(self, prompt: str) -> int:
        if self.api == "chat":
            ids = self.tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                               tokenize=True, **self.kwargs)
            if isinstance(ids, dict) or hasattr(ids, "keys"):
                ids = ids["input_ids"]
            return len(ids)
        return len(self.tok(prompt)["input_ids"])

    def count_text(self, text: str) -> int:
        """Tokens of generated text as it stands (no template, no special tokens)."""
        return len(self.tok(text, add_special_tokens=False)["input_ids"])


@dataclass
class Calibrated:
    target_tokens: int
    prompt: str
    tokens: int
    counter: str
    probes: int


def _filler_words(filler: str, n: int) -> str:
    base = filler.split()
    reps = n // len(base) + 1
    return " ".join((base * reps)[:n])


def calibrate(counter: TokenCounter, target_tokens: int, filler: str,
              max_probes: int = 80, head: str = "") -> Calibrated:
    """Find the prompt whose token count is closest to `target_tokens` from below, then pad.

    `head`, when given, is a fixed start of every candidate (a shared prefix); the filler
    words after it are what the search sizes.

    Raises ValueError when even a one-word prompt is longer than the target (the chat
    template alone exceeds it).
    """
    probes = 0

    def n_tokens(text: str) -> int:
        nonlocal probes
        probes += 1
        return counter.count(text)

    def _words(filler: str, n: int) -> str:
        return head + _filler_words(filler, n)

    lo_n, lo_t = 1, n_tokens(_words(filler, 1))
    if lo_t > target_tokens:
        raise ValueError(f"target of {target_tokens} prompt tokens is below the chat template's own "
                         f"length ({lo_t} tokens for a one-word prompt)")
    hi_n = 2
    while True:  # exponential search for an upper bound
        t = n_tokens(_words(filler, hi_n))
        if t >= target_tokens:
            hi_t = t
            break
        lo_n, lo_t = hi_n, t
        hi_n *= 2
        if probes > max_probes:
            raise ValueError(f"could not reach {target_tokens} tokens")
    if hi_t == target_tokens:
        return Calibrated(target_tokens, _words(filler, hi_n), hi_t, counter.name, probes)
    while hi_n - lo_n > 1:  # binary search: count(lo) < target < count(hi)
        mid = (lo_n + hi_n) // 2
        t = n_tokens(_words(filler, mid))
        if t == target_tokens:
            return Calibrated(target_tokens, _words(filler, mid), t, counter.name, probes)
        if t < target_tokens:
            lo_n, lo_t = mid, t
        else:
            hi_n = mid
    prompt, tokens = _words(filler, lo_n), lo_t
    # close the remaining gap (usually 1-3 tokens) with one-token words
    while tokens < target_tokens and probes < max_probes:
        t = n_tokens(prompt + PAD_WORD)
        if t > target_tokens:
            break
        prompt, tokens = prompt + PAD_WORD, t
    return Calibrated(target_tokens, prompt, tokens, counter.name, probes)


def token_counter(base_url: str, model: str, api: str, headers: dict[str, str] | None,
                  tokenizer_dir: str | None, chat_template_kwargs: dict | None = None,
                  warn: Callable[[str], None] = print) -> TokenCounter:
    """The server's /tokenize when it works, else the local tokenizer; raises if neither."""
    srv = ServerTokenizer(base_url, model, api, headers, chat_template_kwargs)
    if srv.available():
        return srv
    if tokenizer_dir:
        warn(f"{base_url} has no usable /tokenize; counting prompt tokens with the local tokenizer {tokenizer_dir}")
        return LocalTokenizer(tokenizer_dir, api, chat_template_kwargs)
    raise ValueError(f"{base_url} has no /tokenize and no local tokenizer is configured "
                     "(host.attach.tokenizer): cannot size prompts")
