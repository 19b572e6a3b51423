"""Streaming OpenAI-compatible client: one request in, one fully timed record out.

Times come from `time.perf_counter_ns` on the client; token counts come from the server's
`usage` (never from the requested `max_tokens`). A stream without `usage` keeps its text
(`output_text`) and fails as `no_usage`; `count_on_client` turns it into a record counted
with the model's tokenizer (`output_tokens_source: "client"`), which the runner does. Every failure is classified and returned
as a record, never raised, so a run accounts for every request it sent. This module knows
nothing about load levels or files; see `runner` for those.

Metric definitions (the report prints them: report/i18n/setup.yaml `definition.*`): ttft_s =
start -> first chunk carrying generated text; e2e_s = start -> last chunk; decode_tps =
(output_tokens - 1) / (e2e_s - ttft_s); e2e_output_tps = output_tokens / e2e_s; tpot_s =
1 / decode_tps; itl_s = gaps between text-carrying chunks.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import aiohttp
import orjson

from ..schema.runfiles import RequestOutcome

BODY_EXCERPT_CHARS = 300

# Failure reasons (record["error_kind"]).
CONNECT = "connect"
TIMEOUT = "timeout"
HTTP_STATUS = "http_status"
DISCONNECT = "disconnect"
MALFORMED = "malformed_stream"
NO_TOKENS = "no_tokens"
NO_USAGE = "no_usage"
CANCELLED = "cancelled"


@dataclass
class RequestSpec:
    """What to send. `prompt` is a chat user message (api=chat) or raw text (api=completions);
    `messages`, when given, is the whole chat conversation instead (sessions)."""

    prompt: str
    max_tokens: int
    model: str
    api: str = "chat"
    temperature: float = 0.0
    seed: int | None = 42
    ignore_eos: bool = True
    cache_salt: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    continuous_usage_stats: bool = False
    extra_body: dict[str, Any] = field(default_factory=dict)
    messages: list[dict[str, Any]] | None = None  # api=chat: the whole conversation instead of `prompt`
    keep_text: bool = False  # return the answer's text (a session resends it as history)

    def path(self) -> str:
        return "/v1/chat/completions" if self.api == "chat" else "/v1/completions"

    def body(self) -> dict[str, Any]:
        b: dict[str, Any] = {
            "model": self.model,
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.continuous_usage_stats:
            b["stream_options"]["continuous_usage_stats"] = True
        if self.api == "chat":
            b["messages"] = self.messages or [{"role": "user", "content": self.prompt}]
            if self.chat_template_kwargs:
                b["chat_template_kwargs"] = self.chat_template_kwargs
        else:
            b["prompt"] = self.prompt
        if self.seed is not None:
            b["seed"] = self.seed
        if self.ignore_eos:
            b["ignore_eos"] = True
        if self.cache_salt:
            b["cache_salt"] = self.cache_salt
        b.update(self.extra_body)
        return b


def _has_text(choice: dict[str, Any]) -> bool:
    delta = choice.get("delta")
    if isinstance(delta, dict):
        return any(delta.get(k) for k in ("content", "reasoning_content", "reasoning"))
    # /v1/completions streams put the text on the choice itself
    return bool(choice.get("text"))


#: the outcome's fields the stream parser sets
STREAM_FIELDS = ("n_chunks", "n_text_chunks", "output_chars", "reasoning_chunks", "end_s", "ttft_s", "content_ttft_s",
                 "finish_reason", "chunk_times_s", "chunk_tokens", "server_chunk_ns", "server_due_ns")


class StreamParser:
    """Incremental parser of an OpenAI SSE stream; feed it lines with their arrival time."""

    def __init__(self, t0_ns: int) -> None:
        self.t0_ns = t0_ns
        self.done = False
        self.usage: dict[str, Any] | None = None
        self.text: list[str] = []  # generated text, for a client-side count when no usage comes
        self.content: list[str] = []  # answer content, kept only with keep_text (a session's history)
        self._tail = b""  # bytes after the last newline, waiting for the rest of their line
        self.keep_text = False
        self.token_ids: list[int] = []  # streamed token ids (vLLM's return_token_ids), kept with keep_text
        # what the stream told so far (`STREAM_FIELDS` of the outcome), kept here as plain attributes: the
        # hot path sets several per chunk, and a model's attribute costs ~10x a plain one
        self.n_chunks = self.n_text_chunks = self.output_chars = self.reasoning_chunks = 0
        self.end_s = 0.0
        self.ttft_s: float | None = None
        self.content_ttft_s: float | None = None
        self.finish_reason: str | None = None
        self.chunk_times_s: list[float] = []
        self.chunk_tokens: list[int] = []  # usage.completion_tokens at each text chunk (continuous usage stats)
        self.server_chunk_ns: list[int] = []
        self.server_due_ns: list[int] = []

    def fill(self, r: RequestOutcome) -> RequestOutcome:
        """`r` with what the stream told (times relative to the send)."""
        for k in STREAM_FIELDS:
            setattr(r, k, getattr(self, k))
        if len(self.chunk_tokens) != len(self.chunk_times_s):
            r.chunk_tokens = []  # a count for every text chunk or none: half a list would misplace tokens
        return r

    def feed_bytes(self, data: bytes, t_ns: int) -> None:
        """Raw body bytes as they arrive: each line completed by `data` is parsed with `t_ns`
        (lines are split on bytes, so a UTF-8 character cut between reads stays whole)."""
        *lines, self._tail = (self._tail + data if self._tail else data).split(b"\n")
        for line in lines:
            if line.strip():
                self.feed(line.decode("utf-8"), t_ns)
                if self.done:
                    return

    def flush(self, t_ns: int) -> None:
        """The body ended: parse a last line that had no newline."""
        if self._tail.strip():
            line, self._tail = self._tail, b""
            self.feed(line.decode("utf-8"), t_ns)

    def feed(self, line: str, t_ns: int) -> None:
        line = line.rstrip("\r")
        if not line or line.startswith(":"):
            return  # keep-alive / comment
        if not line.startswith("data:"):
            if line.startswith(("event:", "id:", "retry:")):
                return
            raise ValueError(f"unexpected SSE line: {line[:80]!r}")
        data = line[5:].strip()
        if data == "[DONE]":
            self.done = True
            self.end_s = (t_ns - self.t0_ns) / 1e9
            return
        obj = orjson.loads(data)  # ~3.5x faster than json.loads per chunk; same errors (ValueError)
        if not isinstance(obj, dict):
            raise ValueError(f"SSE data is not an object: {data[:80]!r}")
        if "error" in obj and "choices" not in obj:
            err = obj["error"]
            raise ValueError(f"server error in stream: {json.dumps(err)[:BODY_EXCERPT_CHARS]}")
        self.n_chunks += 1
        t_s = (t_ns - self.t0_ns) / 1e9
        self.end_s = t_s
        texts = self.n_text_chunks
        for ch in obj.get("choices") or []:
            if self.keep_text and ch.get("token_ids"):
                self.token_ids.extend(int(t) for t in ch["token_ids"])
            if _has_text(ch):
                if self.ttft_s is None:
                    self.ttft_s = t_s
                self.n_text_chunks += 1
                self.chunk_times_s.append(t_s)
                if "servelab_t_ns" in obj:
                    self.server_chunk_ns.append(obj["servelab_t_ns"])
                    if "servelab_due_ns" in obj:
                        self.server_due_ns.append(obj["servelab_due_ns"])
                d = ch.get("delta") or {}
                content = d.get("content") or ch.get("text") or ""
                reasoning = d.get("reasoning_content") or d.get("reasoning") or ""
                self.output_chars += len(content or reasoning)
                self.text.append(content or reasoning)
                if reasoning:
                    self.reasoning_chunks += 1
                if content:
                    if self.content_ttft_s is None:
                        self.content_ttft_s = t_s
                    if self.keep_text:
                        self.content.append(content)
            if ch.get("finish_reason"):
                self.finish_reason = ch["finish_reason"]
        if obj.get("usage"):
            self.usage = obj["usage"]
            if self.n_text_chunks > texts and "completion_tokens" in self.usage:
                self.chunk_tokens.append(int(self.usage["completion_tokens"]))


async def send(client: "StreamClient", spec: RequestSpec, *, timeout_s: float,
               headers: dict[str, str] | None = None) -> RequestOutcome:
    """Send one streaming request and time it. Never raises for server or network faults."""
    r = RequestOutcome()
    t0 = time.perf_counter_ns()
    r.start_s, r.sent_unix_s = t0 / 1e9, time.time()
    try:
        async with asyncio.timeout(timeout_s):
            await _stream(client, spec, r, t0, headers)
    except TimeoutError:
        _fail(r, TIMEOUT, f"no complete response within {timeout_s:g} s")
    except aiohttp.ClientError as e:
        _fail(r, *_classify(e))
    except asyncio.CancelledError:
        # the run was interrupted: keep the request accounted for instead of losing it
        _fail(r, CANCELLED, "cancelled by interrupt")
    if r.end_s == 0.0 or not r.ok:
        r.end_s = r.end_s or (time.perf_counter_ns() - t0) / 1e9
    # end_s becomes absolute like start_s
    r.end_s = r.start_s + r.end_s
    return r.with_rates()


def _classify(e: aiohttp.ClientError) -> tuple[str, str]:
    """(failure kind, detail) of a transport error."""
    if isinstance(e, aiohttp.ClientConnectorError):
        return CONNECT, str(e) or type(e).__name__
    if isinstance(e, aiohttp.ServerTimeoutError):
        return TIMEOUT, f"{type(e).__name__}: {e}"
    return DISCONNECT, f"{type(e).__name__}: {e}"  # closed, reset or truncated by the server mid-request


def _fail(r: RequestOutcome, kind: str, detail: str) -> None:
    if r.error_kind is None:
        r.ok = False
        r.error_kind = kind
        r.error_detail = detail[:BODY_EXCERPT_CHARS * 2]


async def _stream(client: "StreamClient", spec: RequestSpec, r: RequestOutcome, t0: int,
                  headers: dict[str, str] | None) -> None:
    async with client.session.post(client.base_url + spec.path(), data=orjson.dumps(spec.body()),
                                   headers={**JSON, **headers} if headers else JSON) as resp:
        r.http_status = resp.status
        if resp.status != 200:
            body = (await resp.read()).decode("utf-8", "replace")
            _fail(r, HTTP_STATUS, f"HTTP {resp.status}: {body[:BODY_EXCERPT_CHARS]}")
            return
        p = StreamParser(t0)
        p.keep_text = spec.keep_text
        try:
            async for data in resp.content.iter_any():  # whatever arrived, parsed by lines in feed_bytes
                p.feed_bytes(data, time.perf_counter_ns())
                if p.done:
                    break
            else:
                p.flush(time.perf_counter_ns())
        except ValueError as e:  # malformed JSON, SSE or UTF-8
            _fail(r, MALFORMED, str(e))
            return
        finally:  # a timeout or a disconnect keeps the chunks that came
            p.fill(r)
    if not p.done:
        _fail(r, MALFORMED, "stream ended without [DONE]")
        return
    if p.usage:
        r.prompt_tokens = p.usage.get("prompt_tokens")
        r.output_tokens = p.usage.get("completion_tokens")
        details = p.usage.get("prompt_tokens_details") or {}
        r.cached_tokens = details.get("cached_tokens")
        r.reasoning_tokens = (p.usage.get("completion_tokens_details") or {}).get("reasoning_tokens")
        r.output_tokens_source = SERVER
    if spec.keep_text:
        r.output_text = "".join(p.content)
        r.output_token_ids = p.token_ids or None
    if r.output_tokens is None:
        r.output_text = "".join(p.text)
        _fail(r, NO_USAGE, "stream carried no usage (stream_options.include_usage ignored?)")
        return
    _finish(r)


def _finish(r: RequestOutcome) -> None:
    """The checks of a stream with its output tokens known (ok, or why not)."""
    if r.output_tokens == 0:
        _fail(r, NO_TOKENS, "server reported 0 completion tokens")
        return
    if r.ttft_s is None:
        # Tokens were generated but none decoded to text (random weights can emit partial
        # UTF-8): no TTFT can be measured, so the request fails rather than borrow a chunk's time.
        _fail(r, NO_TOKENS, f"{r.output_tokens} tokens generated but no chunk carried text")
        return
    r.e2e_s = r.end_s
    r.ok = True


SERVER, CLIENT = "server", "client"


def count_on_client(r: RequestOutcome, count: Callable[[str], int]) -> RequestOutcome:
    """A `no_usage` outcome (with its `output_text`) with its output tokens counted by `count(text)` (the
    model's tokenizer): ok, `output_tokens_source` "client", and the rates recomputed. Other outcomes
    come back unchanged. Raises what `count` raises."""
    if r.error_kind != NO_USAGE or r.output_text is None:
        return r
    r = r.model_copy()
    r.output_tokens, r.output_tokens_source = count(r.output_text or ""), CLIENT
    r.ok, r.error_kind, r.error_detail, r.output_text = False, None, None, None
    r.end_s -= r.start_s  # _finish works on times relative to the start, as the stream does
    _finish(r)
    r.end_s += r.start_s
    return r.with_rates()


JSON = {"Content-Type": "application/json"}


# An idle pooled connection is dropped after this long: below the server's own keep-alive (vLLM's
# VLLM_HTTP_TIMEOUT_KEEP_ALIVE and uvicorn's default: 5 s). aiohttp keeps one 15 s, so a request sent
# after 5-15 s of idleness (an engine waiting its turn in an interleaved run) went out on a
# connection the server had just closed: "ServerDisconnectedError" (1 of 432 requests, measured).
KEEPALIVE_S = 4.0


class StreamClient:
    """The connection pool streaming requests go through: `async with StreamClient(url, ...) as c`.

    aiohttp, not httpx, on this one path: its HTTP parser is C, and per streamed chunk it costs
    ~25 us of client CPU against ~40 us for httpx over the same aiohttp transport and ~90 us for
    httpx's own httpcore + h11 stack (benchmarks/client_cpu.py, 256 streams on 2 vCPUs). A
    client that takes longer per chunk than the server falls behind in every burst of first
    tokens, and that lag is timing error (servelab calibrate). Other HTTP (metrics, /tokenize,
    health) stays on httpx.
    """

    def __init__(self, base_url: str, *, concurrency: int, headers: dict[str, str] | None = None,
                 connect_timeout_s: float = 10.0) -> None:
        """Sized for `concurrency` streams: one connection each."""
        self.base_url = base_url.rstrip("/")
        self.limit = concurrency + 4  # one connection per stream, a few spare
        self.headers = dict(headers or {})
        self.connect_timeout_s = connect_timeout_s
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("StreamClient is used outside `async with`")
        return self._session

    async def __aenter__(self) -> "StreamClient":
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=self.limit, limit_per_host=0, keepalive_timeout=KEEPALIVE_S),
            headers=self.headers,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.connect_timeout_s),
            auto_decompress=False)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def status(self, path: str, timeout_s: float = 5.0) -> int | None:
        """HTTP status of a GET (health checks), None when the server cannot be reached."""
        try:
            async with self.session.get(self.base_url + path, timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
                return r.status
        except (aiohttp.ClientError, TimeoutError):
            return None
