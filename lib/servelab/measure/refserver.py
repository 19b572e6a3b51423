"""Reference server: an OpenAI-compatible streaming server whose true timings are known.

It emits `max_tokens` tokens with a programmed TTFT, inter-token gap, jitter and chunk
coalescing, ends with a usage chunk and `[DONE]`, and can inject faults (HTTP 429/500/503,
connection reset, stall, malformed SSE, empty choices, no usage). Tests and the client
self-check use it to measure servelab's own error. A bare asyncio HTTP/1.1 server with
chunked transfer encoding keeps it cheap enough for hundreds of streams on two cores.
Not a model: the text is filler, `/tokenize` counts words plus a fixed template overhead.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import selectors
import threading
import time
from dataclasses import dataclass, field
from collections.abc import Awaitable, Callable
from typing import Any

TEMPLATE_TOKENS = 5  # what the fake chat template adds to a prompt
FAULTS = ("http_429", "http_500", "http_503", "reset", "stall", "malformed", "empty_choices", "no_usage",
          "no_done")


@dataclass
class Behaviour:
    ttft_s: float = 0.05
    itl_s: float = 0.01
    jitter_s: float = 0.0
    tokens_per_chunk: int = 1
    fault: str | None = None  # apply to every request (or use fault_every)
    fault_every: int = 0  # apply `fault` to every n-th request only (1-based count)
    fault_mix: tuple[str | None, ...] = ()  # request n gets fault_mix[(n - 1) % len] (None: none); overrides fault
    seed: int = 0
    metrics: bool = True
    tokenize: bool = True
    reasoning_tokens: int = 0  # the first n tokens stream on the reasoning channel (delta.reasoning_content)
    usage: bool = True  # False: never stream a usage chunk, whatever the request asks (as some servers do)
    slots: int = 0  # >0: at most this many streams at once, the rest queue (a known capacity)
    # answer(prompt, requests already running) -> the answer's words, instead of " tok" filler: a test's
    # stand-in for a model whose answers may depend on the load; streams token ids when asked
    answer: Callable[[str, int], str] | None = None
    # request n (1-based) waits warming_s[n - 1] more for its first token: a server just after it started
    warming_s: tuple[float, ...] = ()


@dataclass
class Stats:
    requests: int = 0
    prompt_tokens_total: int = 0
    generation_tokens_total: int = 0
    running: int = 0
    faults: dict[str, int] = field(default_factory=dict)


def count_tokens(text: str) -> int:
    return len(text.split())


_EPOLL = getattr(selectors, "EpollSelector", selectors.DefaultSelector)  # epoll: Linux


class _PreciseEpollSelector(_EPOLL):  # type: ignore[misc,valid-type]
    """epoll waits in whole milliseconds (rounded up), so asyncio timers fire 0-1 ms late and
    the emitted gaps jitter by ~0.5 ms (2-3 % of a 20 ms gap). Wait in epoll until at least 1 ms
    before the next timer, then sleep the rest on the nanosecond clock: gaps within ~0.05 ms.
    Costs no CPU; I/O that arrives in that last millisecond waits for it."""

    def select(self, timeout: float | None = None) -> list[Any]:
        if timeout is not None and timeout > 0:
            deadline = time.monotonic() + timeout
            coarse = math.floor(timeout * 1e3 - 1.0) / 1e3
            if coarse > 0:
                ready = super().select(coarse)
                if ready:
                    return ready
            rest = deadline - time.monotonic()
            if rest > 0:
                time.sleep(rest)
            timeout = 0
        return super().select(timeout)


def _new_loop(precise: bool) -> asyncio.AbstractEventLoop:
    """The server's event loop: uvloop when it is the installed policy (throughput), else asyncio
    with precise timers when epoll is available (timing fidelity), else asyncio's default."""
    policy = type(asyncio.get_event_loop_policy()).__module__
    if precise and not policy.startswith("uvloop") and hasattr(selectors, "EpollSelector"):
        return asyncio.SelectorEventLoop(_PreciseEpollSelector())
    return asyncio.new_event_loop()


class RefServer:
    """Run in a background thread: `with RefServer(Behaviour(...)) as s: s.url`."""

    def __init__(self, behaviour: Behaviour | None = None, host: str = "127.0.0.1", port: int = 0,
                 precise_timers: bool = True) -> None:
        self.b = behaviour or Behaviour()
        self.host, self.port = host, port
        self.precise_timers = precise_timers
        self.stats = Stats()
        self._rng = random.Random(self.b.seed)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.base_events.Server | None = None
        self._ready = threading.Event()
        self._error: OSError | None = None  # the bind's error (a port already taken), raised by start()
        self._slots: asyncio.Semaphore | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    # -- thread lifecycle ------------------------------------------------------------------
    def start(self) -> "RefServer":
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("reference server did not start")
        if self._error is not None:
            raise self._error
        return self

    def _run(self) -> None:
        self._loop = _new_loop(self.precise_timers)
        asyncio.set_event_loop(self._loop)
        try:
            self._server = self._loop.run_until_complete(
                asyncio.start_server(self._handle, self.host, self.port, backlog=2048))
        except OSError as e:  # at once, not after start()'s wait
            self._error = e
            self._ready.set()
            return
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    def stop(self) -> None:
        if self._loop and self._server:
            async def _close() -> None:
                self._server.close()
                for t in asyncio.all_tasks():
                    if t is not asyncio.current_task():
                        t.cancel()
                await self._server.wait_closed()
            fut = asyncio.run_coroutine_threadsafe(_close(), self._loop)
            try:
                fut.result(5)
            except Exception:
                pass
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._server = None
        if self._thread:
            self._thread.join(5)

    def __enter__(self) -> "RefServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- HTTP --------------------------------------------------------------------------------
    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {k.lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:] if ":" in ln)}
                n = int(headers.get("content-length", "0"))
                body = await reader.readexactly(n) if n else b""
                keep = await self._route(method, path.split("?")[0], headers, body, writer)
                if not keep or headers.get("connection", "").lower() == "close":
                    break
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            pass
        finally:
            try:
                writer.close()
            except Exception:
                pass

    @staticmethod
    async def _send(writer: asyncio.StreamWriter, status: int, body: bytes, ctype: str = "application/json") -> bool:
        reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 429: "Too Many Requests",
                  500: "Internal Server Error", 503: "Service Unavailable"}.get(status, "X")
        writer.write(f"HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n\r\n"
                     .encode() + body)
        await writer.drain()
        return True

    async def _route(self, method: str, path: str, headers: dict[str, str], body: bytes,
                     writer: asyncio.StreamWriter) -> bool:
        if path == "/health":
            return await self._send(writer, 200, b"")
        if path == "/version":
            return await self._send(writer, 200, b'{"version":"servelab-refserver"}')
        if path == "/v1/models":
            return await self._send(writer, 200, b'{"object":"list","data":[{"id":"ref","object":"model"}]}')
        if path == "/metrics":
            if not self.b.metrics:
                return await self._send(writer, 404, b"not found", "text/plain")
            s = self.stats
            txt = (f"vllm:num_requests_running{{model_name=\"ref\"}} {s.running}\n"
                   f"vllm:num_requests_waiting{{model_name=\"ref\"}} 0\n"
                   f"vllm:prompt_tokens_total{{model_name=\"ref\"}} {s.prompt_tokens_total}\n"
                   f"vllm:generation_tokens_total{{model_name=\"ref\"}} {s.generation_tokens_total}\n")
            return await self._send(writer, 200, txt.encode(), "text/plain")
        if path == "/tokenize" and method == "POST" and self.b.tokenize:
            req = json.loads(body or b"{}")
            if "messages" in req:
                n = sum(count_tokens(m.get("content", "")) for m in req["messages"]) + TEMPLATE_TOKENS
            else:
                n = count_tokens(req.get("prompt", ""))
            return await self._send(writer, 200, json.dumps({"count": n, "max_model_len": 1 << 20}).encode())
        if path in ("/v1/chat/completions", "/v1/completions") and method == "POST":
            return await self._complete(path, json.loads(body or b"{}"), writer)
        return await self._send(writer, 404, b'{"error":"not found"}')

    def _fault_for(self) -> str | None:
        self.stats.requests += 1
        if self.b.fault_mix:
            f = self.b.fault_mix[(self.stats.requests - 1) % len(self.b.fault_mix)]
        else:
            f = self.b.fault
            if f and self.b.fault_every > 0 and self.stats.requests % self.b.fault_every:
                f = None
        if f:
            self.stats.faults[f] = self.stats.faults.get(f, 0) + 1
        return f

    async def _complete(self, path: str, req: dict[str, Any], writer: asyncio.StreamWriter) -> bool:
        chat = path.endswith("chat/completions")
        if req.get("cache_salt") == "":
            return await self._send(writer, 400, b'{"error":"cache_salt must be non-empty"}')
        fault = self._fault_for()
        if fault and fault.startswith("http_"):
            code = int(fault[5:])
            return await self._send(writer, code, json.dumps({"error": {"message": f"injected {code}"}}).encode())
        prompt = (" ".join(m.get("content", "") for m in req.get("messages", [])) if chat else req.get("prompt", ""))
        p_tok = count_tokens(prompt) + (TEMPLATE_TOKENS if chat else 0)
        n_tok = cap = int(req.get("max_tokens") or 16)
        words = self.b.answer(prompt, self.stats.running).split() if self.b.answer else None
        if words is not None:
            words = words[:n_tok]
            n_tok = len(words)
        answer = (words, bool(req.get("return_token_ids")), cap) if words is not None else None
        include_usage = bool((req.get("stream_options") or {}).get("include_usage"))
        # a stream that will end abnormally says so up front, so the client never reuses the connection
        close = b"Connection: close\r\n" if fault in ("no_done", "reset", "stall") else b""
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
                     + close + b"\r\n")
        await writer.drain()
        if self.b.slots and self._slots is None:
            self._slots = asyncio.Semaphore(self.b.slots)
        if self._slots is not None:
            await self._slots.acquire()  # queued: the TTFT clock has started on the client
        self.stats.running += 1
        self.stats.prompt_tokens_total += p_tok
        n = self.stats.requests
        if n <= len(self.b.warming_s):
            await asyncio.sleep(self.b.warming_s[n - 1])
        try:
            if answer is not None:
                return await self._stream_answer(writer, chat, *answer, p_tok, include_usage)
            return await self._stream(writer, chat, n_tok, p_tok, include_usage, fault)
        finally:
            self.stats.running -= 1
            if self._slots is not None:
                self._slots.release()

    async def _stream(self, writer: asyncio.StreamWriter, chat: bool, n_tok: int, p_tok: int,
                      include_usage: bool, fault: str | None) -> bool:
        transport = writer.transport

        async def event(obj: Any) -> None:
            data = (b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n")
            writer.write(b"%x\r\n%b\r\n" % (len(data), data))
            # performance: drain only when something is buffered or the peer is gone; an empty
            # buffer means the bytes went out at once and drain() would only cost a task switch
            if transport.get_write_buffer_size() or transport.is_closing():
                await writer.drain()

        base = {"id": "cmpl-ref", "object": "chat.completion.chunk" if chat else "text_completion", "model": "ref"}
        if chat:
            await event({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
        t0 = time.perf_counter()
        sent = 0
        k = max(1, self.b.tokens_per_chunk)
        templates: dict[tuple[int, bool], bytes] = {}
        while sent < n_tok:
            # absolute schedule: token i is due at ttft + i*itl (+ jitter), so delays never accumulate
            due = self.b.ttft_s + (sent + k - 1) * self.b.itl_s
            if self.b.jitter_s:
                due += self._rng.uniform(-self.b.jitter_s, self.b.jitter_s)
            wait = t0 + due - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
            if fault == "reset" and sent >= n_tok // 2:
                writer.transport.abort()
                return False
            if fault == "stall" and sent >= n_tok // 2:
                await asyncio.sleep(3600)
            if fault == "malformed" and sent >= n_tok // 2:
                await event(b"{not json")
            step = min(k, n_tok - sent)
            thinking = sent < self.b.reasoning_tokens  # a chunk is on one channel: where it starts
            sent += step
            if (step, thinking) not in templates:
                templates[step, thinking] = _chunk_template(base, chat, step, thinking, fault)
            # emission time on the machine-wide monotonic clock: the self-check compares it with
            # the client's arrival time, and with the schedule (server lateness)
            await event(templates[step, thinking] % (time.perf_counter_ns(), int((t0 + due) * 1e9)))
            self.stats.generation_tokens_total += step
        await self._stream_end(event, base, chat, n_tok, p_tok, include_usage, fault)
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return fault != "no_done"

    async def _stream_end(self, event: Callable[[Any], Awaitable[None]], base: dict[str, Any], chat: bool,
                          n_tok: int, p_tok: int, include_usage: bool, fault: str | None) -> None:
        """After the tokens: the finish chunk, the usage chunk when asked, and [DONE] (each unless a fault drops it)."""
        if fault != "empty_choices":
            fin = ({"index": 0, "delta": {}, "finish_reason": "length"} if chat
                   else {"index": 0, "text": "", "finish_reason": "length"})
            await event({**base, "choices": [fin]})
        if include_usage and self.b.usage and fault != "no_usage":
            usage: dict[str, Any] = {"prompt_tokens": p_tok, "completion_tokens": n_tok, "total_tokens": p_tok + n_tok}
            if self.b.reasoning_tokens:
                usage["completion_tokens_details"] = {"reasoning_tokens": min(n_tok, self.b.reasoning_tokens)}
            await event({**base, "choices": [], "usage": usage})
        if fault != "no_done":
            await event(b"[DONE]")

    async def _stream_answer(self, writer: asyncio.StreamWriter, chat: bool, words: list[str], ids: bool, cap: int,
                             p_tok: int, include_usage: bool) -> bool:
        """The stand-in's own answer (`Behaviour.answer`): one word a chunk on the TTFT/ITL schedule, its
        token id when asked, "stop" when it ends before the cap."""
        async def event(obj: Any) -> None:
            data = b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"
            writer.write(b"%x\r\n%b\r\n" % (len(data), data))
            await writer.drain()

        base = {"id": "cmpl-ref", "object": "chat.completion.chunk" if chat else "text_completion", "model": "ref"}
        t0 = time.perf_counter()
        for i, w in enumerate(words):
            wait = t0 + self.b.ttft_s + i * self.b.itl_s - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
            choice: dict[str, Any] = ({"index": 0, "delta": {"content": " " + w}, "finish_reason": None} if chat
                                      else {"index": 0, "text": " " + w, "finish_reason": None})
            if ids:
                choice["token_ids"] = [sum(w.encode()) % 997]
            await event({**base, "choices": [choice]})
            self.stats.generation_tokens_total += 1
        end = "stop" if len(words) < cap else "length"
        await event({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": end} if chat
                                         else {"index": 0, "text": "", "finish_reason": end}]})
        if include_usage:
            await event({**base, "choices": [], "usage": {"prompt_tokens": p_tok, "completion_tokens": len(words),
                                                           "total_tokens": p_tok + len(words)}})
        await event(b"[DONE]")
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True


def _chunk_template(base: dict[str, Any], chat: bool, step: int, thinking: bool, fault: str | None) -> bytes:
    """A text chunk of `step` tokens (on the reasoning channel when `thinking`) with %d for its two stamps."""
    text = " tok" * step
    choice = ({"index": 0, "delta": {"reasoning_content" if thinking else "content": text},
               "finish_reason": None} if chat
              else {"index": 0, "text": text, "finish_reason": None})
    # performance: the bytes json.dumps({**base, "choices": [...], **stamp}) gives,
    # serialized once per chunk shape; only the two stamps change per chunk
    body = json.dumps({**base, "choices": [] if fault == "empty_choices" else [choice]})
    return (body[:-1] + ', "servelab_t_ns": %d, "servelab_due_ns": %d}').encode()


def main(argv: list[str] | None = None) -> None:
    """Run the reference server in the foreground (its own process: own core, own GIL)."""
    ap = argparse.ArgumentParser(prog="python -m servelab.measure.refserver")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8100)
    ap.add_argument("--ttft", type=float, default=0.05, help="seconds to the first token")
    ap.add_argument("--itl", type=float, default=0.01, help="seconds between tokens")
    ap.add_argument("--jitter", type=float, default=0.0)
    ap.add_argument("--tokens-per-chunk", type=int, default=1)
    ap.add_argument("--fault", choices=FAULTS)
    ap.add_argument("--fault-every", type=int, default=0)
    ap.add_argument("--no-usage", action="store_true", help="never stream a usage chunk")
    ap.add_argument("--slots", type=int, default=0,
                    help="at most this many streams at once, the rest queue (0: no limit)")
    ap.add_argument("--uvloop", action="store_true",
                    help="use uvloop if installed (more streams per core, but millisecond timers: gaps jitter ~0.5 ms)")
    a = ap.parse_args(argv)
    if a.uvloop:
        try:
            import uvloop

            uvloop.install()
        except ImportError:
            pass
    srv = RefServer(Behaviour(ttft_s=a.ttft, itl_s=a.itl, jitter_s=a.jitter, tokens_per_chunk=a.tokens_per_chunk,
                              fault=a.fault, fault_every=a.fault_every, usage=not a.no_usage, slots=a.slots),
                    a.host, a.port)
    srv.start()
    print(f"reference server on {srv.url}", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        srv.stop()


if __name__ == "__main__":
    main()
