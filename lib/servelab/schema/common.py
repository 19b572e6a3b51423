"""What every part of the schema builds on: `Strict` (unknown keys are errors) and the type of an
engine flag's value. No other schema module is imported here."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

FlagValue = str | int | float | bool | list[Any] | dict[str, Any] | None


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")
