"""The post-launch smoke check: one chat reply and, where a tool-call parser is
set, one forced tool call, recorded in the run. With dummy weights the answers are recorded
but the check does not apply. Not for measuring speed (`measure`)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
from .. import yamlio

# -- smoke check -----------------------------------------------------------------------------
SMOKE_PROMPT = yamlio.safe_load((Path(__file__).parent / "data" / "smoke.yaml").read_text(encoding="utf-8"))["chat_prompt"]

TOOL_PROMPT = "Call get_weather for Tokyo."

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}

DUMMY_REASON = ("dummy weights: the server answered, but random weights produce random text, so the reply "
                "and the tool call cannot be judged; the functional check does not apply")


def _post(client: Any, url: str, body: dict[str, Any], headers: dict[str, str]) -> tuple[dict[str, Any], Any]:
    t0 = time.perf_counter()
    rec: dict[str, Any] = {"request": body}
    try:
        r = client.post(url, json=body, headers=headers)
    except Exception as e:  # noqa: BLE001 - any transport error is a finding, not a crash
        rec.update(status=None, error=f"{type(e).__name__}: {e}", seconds=time.perf_counter() - t0)
        return rec, None
    rec.update(status=r.status_code, seconds=round(time.perf_counter() - t0, 3))
    try:
        data = r.json()
    except ValueError:
        rec["error"] = f"not JSON: {r.text[:200]}"
        return rec, None
    if r.status_code != 200:
        rec["error"] = f"HTTP {r.status_code}: {json.dumps(data)[:300]}"
        return rec, None
    return rec, data


def _chat(c: Any, url: str, model: str, hdrs: dict[str, str], max_tokens: int) -> dict[str, Any]:
    """The chat request's record: its reply text, reasoning, finish reason and usage (or an error)."""
    chat_req = {"model": model, "messages": [{"role": "user", "content": SMOKE_PROMPT}],
                "temperature": 0, "max_tokens": max_tokens}
    chat, data = _post(c, url, chat_req, hdrs)
    if data is not None:
        try:
            msg = data["choices"][0]["message"]
            chat.update(text=msg.get("content") or "",
                        reasoning=msg.get("reasoning_content") or msg.get("reasoning") or "",
                        finish_reason=data["choices"][0].get("finish_reason"), usage=data.get("usage"))
        except (KeyError, IndexError, TypeError):
            chat["error"] = f"no choices[0].message in {json.dumps(data)[:300]}"
    return chat


def _tool_call(c: Any, url: str, model: str, hdrs: dict[str, str], max_tokens: int) -> dict[str, Any]:
    """The forced get_weather request's record: the function called, its parsed arguments, and `ok`."""
    tool_req = {"model": model, "messages": [{"role": "user", "content": TOOL_PROMPT}],
                "tools": [WEATHER_TOOL], "tool_choice": "required", "temperature": 0,
                "max_tokens": max_tokens}
    tool, data = _post(c, url, tool_req, hdrs)
    if data is not None:
        try:
            calls = data["choices"][0]["message"].get("tool_calls") or []
        except (KeyError, IndexError, TypeError, AttributeError):
            calls = []
            tool["error"] = f"no choices[0].message in {json.dumps(data)[:300]}"
        fn = (calls[0].get("function") or {}) if calls else {}
        tool["function"] = fn or None
        try:
            parsed = json.loads(fn.get("arguments") or "null")
        except (TypeError, ValueError):
            parsed = None
        tool["arguments"] = parsed
    tool["ok"] = bool(tool.get("function")) and tool["function"].get("name") == "get_weather" \
        and isinstance(tool.get("arguments"), dict) and bool(tool["arguments"].get("city"))
    return tool


def smoke_check(base_url: str, model: str, headers: dict[str, str] | None = None, tool_call: bool = False,
                dummy_weights: bool = False, *, client: Any = None, timeout_s: float = 120.0,
                max_tokens: int = 128) -> dict[str, Any]:
    """One chat reply and (with `tool_call`) one forced get_weather call, recorded.

    Returns {"applies", "ok", "reason", "answered", "chat": {...}, "tool_call": {...}|None}.
    With dummy weights the requests are still sent (the server must answer 200 with a
    well-formed body: `answered`), but `applies` is False and `ok` None, with the reason.
    """
    base = base_url.rstrip("/")
    if base.endswith("/v1"):
        base = base[:-3]
    url = base + "/v1/chat/completions"
    hdrs = dict(headers or {})
    own = client is None
    c = client or httpx.Client(timeout=timeout_s)
    try:
        chat = _chat(c, url, model, hdrs, max_tokens)
        chat_answered = chat.get("status") == 200 and "error" not in chat
        chat["ok"] = chat_answered and bool((chat.get("text") or chat.get("reasoning") or "").strip())
        tool = None
        if tool_call:
            tool = _tool_call(c, url, model, hdrs, max_tokens)
            tool_answered = tool.get("status") == 200 and "error" not in tool
        else:
            tool_answered = True
    finally:
        if own:
            c.close()
    answered = chat_answered and tool_answered
    if dummy_weights:
        return {"applies": False, "ok": None, "reason": DUMMY_REASON, "answered": answered,
                "chat": chat, "tool_call": tool}
    ok = chat["ok"] and (tool is None or tool["ok"])
    reason = None
    if not chat["ok"]:
        reason = "chat: " + (chat.get("error") or "empty reply")
    elif tool is not None and not tool["ok"]:
        reason = "tool call: " + (tool.get("error") or f"expected get_weather with a city, got {tool.get('function')}")
    return {"applies": True, "ok": ok, "reason": reason, "answered": answered, "chat": chat, "tool_call": tool}
