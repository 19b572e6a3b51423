"""Prompt sets shipped with the package (`lib/servelab/data/prompts/<name>.yaml`): real text for
a workload bucket (`prompt_set:`) and the known-answer tasks of the quality check. A set is
{name, description, kind: copy | free, prompts: [{id, text | messages, expected?}]}; `copy` sets
ask for answers that repeat the prompt (where n-gram speculative decoding finds drafts). Data
and its loader only: sending requests is `measure`, scoring is `measure.quality`.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from . import yamlio
from pydantic import BaseModel, ConfigDict, Field, model_validator

PROMPTS_DIR = Path(__file__).parent / "data" / "prompts"


class Prompt(BaseModel):
    """One prompt of a set."""

    model_config = ConfigDict(extra="forbid")
    id: str = Field(..., pattern=r"^[a-z0-9][a-z0-9-]*$", description="stable id within the set (records carry it)")
    text: str | None = Field(None, description="the user message (chat) or the raw prompt (completions)")
    messages: list[dict[str, Any]] | None = Field(None, description="a whole chat conversation instead of text")
    expected: str | None = Field(None, description="known answer; 'a|b' accepts either (quality scoring)")

    @model_validator(mode="after")
    def _one(self) -> "Prompt":
        if (self.text is None) == (self.messages is None):
            raise ValueError(f"prompt {self.id}: give exactly one of 'text' or 'messages'")
        return self

    def chat(self) -> list[dict[str, Any]]:
        """The chat messages of this prompt."""
        return self.messages if self.messages is not None else [{"role": "user", "content": self.text}]

    def raw(self) -> str:
        """The prompt as one text (completions API): the text, else the messages' contents joined."""
        if self.text is not None:
            return self.text
        return "\n\n".join(str(m.get("content") or "") for m in self.messages or [])


class PromptSet(BaseModel):
    """A named list of prompts."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(..., description="the set's name (its file name)")
    description: str = Field(..., description="what the prompts ask for")
    kind: Literal["copy", "free"] = Field(..., description="copy: answers repeat the prompt; free: free generation")
    prompts: list[Prompt] = Field(..., min_length=1, description="the prompts, in the order they are sent")

    @model_validator(mode="after")
    def _unique(self) -> "PromptSet":
        ids = [p.id for p in self.prompts]
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup:
            raise ValueError(f"prompt set {self.name}: duplicate ids {dup}")
        return self



def list_sets() -> list[str]:
    """Names of the shipped prompt sets, sorted."""
    return sorted(p.stem for p in PROMPTS_DIR.glob("*.yaml"))


@lru_cache(maxsize=None)
def load_set(name: str) -> PromptSet:
    """The shipped set `name`; raises KeyError (with the known names) when there is none."""
    path = PROMPTS_DIR / f"{name}.yaml"
    if not path.is_file():
        raise KeyError(f"unknown prompt set {name!r}; known: {', '.join(list_sets())}")
    ps = PromptSet.model_validate(yamlio.safe_load(path.read_text(encoding="utf-8")))
    if ps.name != name:
        raise ValueError(f"{path}: name {ps.name!r} differs from the file name")
    return ps
