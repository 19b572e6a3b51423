"""Where a bucket's prompts come from, besides the calibrated filler: a session template
(multi-turn conversations that resend their history) or a request trace (arrivals, lengths and
prefix-block ids from a file), and the arrival shapes beyond constant and Poisson. Strict
pydantic models used by `parts.Bucket` and `parts.Workload`; they validate only."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SessionTemplate(_Strict):
    """Conversations: each turn resends the whole history plus one new message.

    The bucket's input_tokens is the length of each new user message (chat) or of the first one
    (agent), its output_tokens each answer's max_tokens."""

    kind: Literal["chat", "agent"] = Field(
        "chat", description="chat: a user message per turn; agent: a long fixed system/tool prompt, then "
        "tool-result messages after the first turn")
    turns: int = Field(4, ge=1, le=256, description="requests per session (the first one sends no history)")
    system_tokens: int = Field(0, ge=0, description="length of the fixed system prompt (agent: the tool "
                               "descriptions); 0 = no system message")
    tool_result_tokens: int | None = Field(
        None, gt=0, description="agent: length of each tool-result message (default: the bucket's input_tokens)")
    think_time_s: float = Field(0.0, ge=0, description="pause between an answer and the next turn of a session")
    answer: Literal["real", "stand-in"] = Field(
        "stand-in", description="what goes back into the history: the model's real answer text, or a fixed "
        "stand-in of output_tokens words (dummy weights emit text that does not re-tokenize to itself)")


class TraceSource(_Strict):
    """A request trace replayed open-loop: its arrivals, lengths and (Mooncake) prefix blocks."""

    path: str = Field(..., description="trace file: Azure LLM inference CSV (TIMESTAMP, ContextTokens, "
                      "GeneratedTokens) or Mooncake JSONL (timestamp ms, input_length, output_length, hash_ids); "
                      "a relative path is taken from the current folder, else the repository root")
    format: Literal["azure", "mooncake"] | None = Field(None, description="file format (default: by extension, "
                                                        ".csv = azure, .jsonl = mooncake)")
    time_scale: float = Field(1.0, gt=0, description="multiply every arrival offset by this (2 = half the rate)")
    length_scale: float = Field(1.0, gt=0, le=1, description="multiply input and output lengths (and the "
                                "prefix-block size) by this, for small servers")
    window_s: tuple[float, float] | None = Field(
        None, description="replay only arrivals in [start, end) seconds of trace time, re-based to start")
    max_requests: int | None = Field(None, gt=0, description="replay at most this many requests")
    block_tokens: int = Field(512, gt=0, description="tokens per hash_id block in the trace (Mooncake: 512)")
    max_input_tokens: int | None = Field(None, gt=0, description="cap each (scaled) input length")
    max_output_tokens: int | None = Field(None, gt=0, description="cap each (scaled) output length")

    @model_validator(mode="after")
    def _window(self) -> "TraceSource":
        if self.window_s and self.window_s[1] <= self.window_s[0]:
            raise ValueError(f"window_s must be [start, end) with end > start, got {list(self.window_s)}")
        return self


class RampUp(_Strict):
    """Open loop: the request rate moves from start to end over each round (vLLM's --ramp-up-*)."""

    strategy: Literal["linear", "exponential"] = Field("linear", description="how the rate moves")
    start_rps: float = Field(..., gt=0, description="rate at the first request of a round")
    end_rps: float = Field(..., gt=0, description="rate at the last request of a round")
