"""The levers table (`data/levers.yaml`): what each lever a study changes is expected to do, and
which knobs to sweep when it surprises. Validated like params: an unknown key is an error, and a
knob must be a flag of every engine it names (`engines` flag tables), with a suggestion."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from ..engines import get
from . import parse_table, read_table
from .parts import Strict

LEVERS_PATH = Path(__file__).resolve().parents[1] / "data" / "levers.yaml"


class Suspect(Strict):
    knob: str = Field(..., description="an engine flag, without dashes")
    engines: list[str] = Field(..., min_length=1, description="engine kinds whose flag it is")
    values: list[Any] = Field(..., min_length=2, description="the values the sweep sets it to")
    why: str = Field(..., description="what the knob could have to do with the surprise")
    default: Any = Field(None, description="the engine's own value when the flag is not given (a sweep does not "
                                           "run it again beside the surprising configuration)")

    @model_validator(mode="after")
    def _known(self) -> "Suspect":
        for kind in self.engines:
            prof = get(kind)
            if self.knob not in prof.known_flags():
                raise ValueError(f"suspect for {kind}: {prof.suggest(self.knob)}")
        return self


class Fix(Strict):
    engines: list[str] = Field(..., min_length=1, description="engine kinds it applies to")
    args: dict[str, Any] = Field(..., min_length=1, description="the flags it sets (on top of the surprising configuration)")
    why: str = Field(..., description="why it may remove the surprise (a source where there is one)")

    @model_validator(mode="after")
    def _known(self) -> "Fix":
        for kind in self.engines:
            prof = get(kind)
            for knob in self.args:
                if knob not in prof.known_flags():
                    raise ValueError(f"fix for {kind}: {prof.suggest(knob)}")
        return self


class Lever(Strict):
    flag: str = Field(..., description="the engine flag a configuration changes (its args key)")
    expect: Literal["no_cost", "faster"] = Field(..., description="no_cost: should not cost throughput; "
                                                 "faster: should raise it")
    why: dict[Literal["en", "ja"], str] = Field(..., description="why that is expected, in each report language")

    def why_in(self, language: str) -> str:
        return self.why.get(language) or self.why["en"]
    suspects: list[Suspect] = Field(default_factory=list, description="knobs to sweep when it surprises")
    fixes: list[Fix] = Field(default_factory=list, description="settings to try when it surprises")


class Levers(Strict):
    levers: list[Lever] = Field(..., min_length=1)

    def of(self, flag: str) -> Lever | None:
        return next((lv for lv in self.levers if lv.flag == flag), None)


def parse_levers(data: dict[str, Any], source: str = "levers") -> Levers:
    """The table from a mapping; ParamsError naming the key path on any problem."""
    return parse_table(Levers, data, source)


@cache
def load_levers(path: str | None = None) -> Levers:
    return read_table(Levers, Path(path) if path else LEVERS_PATH)


__all__ = ["Fix", "Lever", "Levers", "Suspect", "load_levers", "parse_levers"]
