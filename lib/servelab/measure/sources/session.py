"""The session source: conversations whose every turn resends the growing history (system
prompt, earlier messages, earlier answers) plus one new message, with think time between turns.
`chat` sessions add a user message per turn; `agent` sessions start from a long fixed
system/tool prompt and continue with tool-result messages. Each session has its own cache_salt,
so the prefix cache can reuse a session's history within that session and nowhere else.
Sessions run concurrently (closed loop: `concurrency` at a time) or start at open-loop arrival
times. A failed turn ends its session. Not for independent requests (`filler`, `trace`)."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Awaitable, Callable

from ...schema import Bucket, Workload
from ..workload import TokenCounter, calibrate
from .base import Draft, RoundCtx

STAND_IN = "This is a fixed stand-in answer of the assistant."
TOOL_TEXT = "Tool output line with records and values."
SYSTEM_TEXT = "You are a careful assistant. Tools: search, read, write, run."

Send = Callable[[Draft], Awaitable[Any]]  # the runner's: send one draft, record it, return the RequestOutcome


class SessionSource:
    kind = "session"
    independent = False

    def __init__(self, bucket: Bucket, wl: Workload, counter: TokenCounter) -> None:
        assert bucket.session and bucket.input_tokens and bucket.output_tokens
        self.bucket, self.wl, self.t = bucket, wl, bucket.session
        overhead = counter.count("a") - 1

        def text(n: int, filler: str) -> str:  # about n tokens of message content
            return calibrate(counter, n + overhead, filler).prompt if n > 0 else ""

        self.system = text(self.t.system_tokens, SYSTEM_TEXT)
        self.user = text(bucket.input_tokens, wl.prompt_text)
        self.tool = text(self.t.tool_result_tokens or bucket.input_tokens, TOOL_TEXT)
        self.stand_in = text(bucket.output_tokens, STAND_IN)

    def calibration(self) -> dict[str, Any]:
        return {"source": "session", "kind": self.t.kind, "turns": self.t.turns, "system_chars": len(self.system),
                "message_chars": len(self.user), "stand_in_chars": len(self.stand_in)}

    def message(self, turn: int) -> dict[str, str]:
        """The new message of a turn (0-based); agent turns after the first return tool results."""
        if self.t.kind == "agent" and turn > 0:
            return {"role": "user", "content": f"Tool result {turn}: {self.tool}"}
        return {"role": "user", "content": f"Turn {turn + 1}: {self.user}"}

    async def run_round(self, ctx: RoundCtx, send: Send, stop: asyncio.Event,
                        budget: Callable[[], bool] | None = None) -> None:
        """Run the round's ctx.n sessions; every turn goes through `send`."""
        done = lambda: stop.is_set() or bool(budget and budget())  # noqa: E731
        if ctx.offsets is None:
            queue = list(range(ctx.n - 1, -1, -1))

            async def worker() -> None:
                while queue and not done():
                    await self.session(ctx, queue.pop(), send, done)

            await asyncio.gather(*(worker() for _ in range(max(1, ctx.concurrency))))
            return
        sem, t0, tasks = asyncio.Semaphore(ctx.concurrency), time.perf_counter(), []

        async def one(sid: int) -> None:
            try:
                await self.session(ctx, sid, send, done)
            finally:
                sem.release()

        for sid, at in enumerate(ctx.offsets):
            wait = t0 + at - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
            if done():
                break
            await sem.acquire()
            tasks.append(asyncio.create_task(one(sid)))
        await asyncio.gather(*tasks)

    async def session(self, ctx: RoundCtx, sid: int, send: Send, done: Callable[[], bool]) -> None:
        b, t = self.bucket, self.t
        salt = f"{ctx.run_token}-L{ctx.level}-r{ctx.round}-s{sid}" if self.wl.cache_salt else None
        history: list[dict[str, Any]] = [{"role": "system", "content": self.system}] if self.system else []
        for turn in range(t.turns):
            if done():
                return
            history.append(self.message(turn))
            res = await send(Draft(max_tokens=b.output_tokens, messages=list(history), cache_salt=salt,
                                   meta={"source": "session", "session_id": f"L{ctx.level}-r{ctx.round}-s{sid}",
                                         "turn": turn}, keep_text=t.answer == "real"))
            if not res.ok:
                return
            history.append({"role": "assistant", "content": res.output_text if t.answer == "real" else self.stand_in})
            if t.think_time_s and turn + 1 < t.turns:
                await asyncio.sleep(t.think_time_s)
