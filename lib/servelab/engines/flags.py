"""Engine flag tables and the generic checks on a configuration's `engine.args`.

Each engine's accepted flags are a data file (`engines/data/<kind>-flags.txt`) extracted from
the engine's own argument parser (`parser_flags`). This module parses a table, normalises
flag spellings (one rule for the whole project: no leading dashes, `_` -> `-`), reads JSON
values, and checks one flag's value against its kind. Engine-specific conflicts live in the
engine's profile (`engines/vllm.py`, `engines/sglang.py`). Not for building command lines.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from .. import yamlio

AUTO = "auto"
DATA = Path(__file__).with_name("data")

_BOOL_STRINGS = {"true", "false", "1", "0", "yes", "no", "on", "off"}


@dataclass(frozen=True)
class FlagSpec:
    name: str
    kind: str  # flag | bool | int | float | str | json | list
    aliases: tuple[str, ...] = ()
    deprecated: bool = False


def _parse_table(text: str) -> dict[str, FlagSpec]:
    out: dict[str, FlagSpec] = {}
    for tok in text.split():
        name, kind, *rest = tok.split(":")
        dep = kind.endswith("!")
        kind = kind.rstrip("!")
        aliases = tuple(a for a in (rest[0].split(",") if rest else []) if a)
        out[name] = FlagSpec(name, kind, aliases, dep)
    return out


def norm(key: str) -> str:
    """The flag spelling engine.flag_args emits: no leading dashes, '_' -> '-'."""
    return str(key).lstrip("-").replace("_", "-")


def parser_flags(parser: Any) -> str:
    """Registry text for an argparse parser (how the tables above were made).

    vLLM:  from vllm.entrypoints.launchers.cli_args import make_arg_parser;
           from vllm.utils.argparse_utils import FlexibleArgumentParser;
           parser_flags(make_arg_parser(FlexibleArgumentParser()))
    SGLang: p = argparse.ArgumentParser(); ServerArgs.add_cli_args(p); parser_flags(p)
    """
    toks = []
    for a in parser._actions:  # noqa: SLF001 - argparse has no public list of actions
        longs = [s for s in a.option_strings if s.startswith("--")]
        if not longs or longs[0] == "--help":
            continue
        name, act = longs[0][2:], type(a).__name__
        tn = getattr(a.type, "__name__", "") or ""
        if act == "BooleanOptionalAction":
            k = "bool"
        elif a.nargs == 0:
            k = "flag"
        elif a.nargs in ("+", "*") or "Append" in act:
            k = "list"
        elif tn == "int":
            k = "int"
        elif tn == "float":
            k = "float"
        elif name.endswith("-config") or tn in ("parse_dataclass", "union_dict_and_str") or "json" in tn.lower():
            k = "json"
        else:
            k = "str"
        if "Deprecat" in act or str(a.help or "").lower().startswith("deprecated"):
            k += "!"
        aliases = [s[2:] for s in longs[1:] if not s.startswith("--no-")]
        toks.append(f"{name}:{k}" + (":" + ",".join(aliases) if aliases else ""))
    return " ".join(toks)


def json_value(v: Any) -> Any:
    """A flag value given as a JSON object or array string, parsed; anything else unchanged."""
    if isinstance(v, str) and v.strip()[:1] in ("{", "["):
        try:
            return json.loads(v)
        except json.JSONDecodeError:
            return v
    return v


def get_flag(args: dict[str, Any] | None, flag: str, default: Any = None) -> Any:
    """The value of `flag` in an `engine.args` dict, whatever its spelling (dashes, underscores)."""
    want = norm(flag)
    for k, v in (args or {}).items():
        if norm(k) == want:
            return v
    return default


def engine_args(engine: Any) -> dict[str, Any]:
    """The flags dict of run.json `engine_params` (or of an `args` dict itself, or EngineParams)."""
    if not engine:
        return {}
    if hasattr(engine, "args"):
        return dict(engine.args)
    if isinstance(engine.get("args"), dict):
        return dict(engine["args"])
    return dict(engine)


def flag_on(args: dict[str, Any] | None, flag: str) -> bool:
    v = get_flag(args, flag)
    return v is not None and v is not False


def flag_args(args: dict[str, Any]) -> list[str]:
    """{'max-num-seqs': 4, 'enforce-eager': True, 'compilation-config': {...}} -> CLI args
    (true = bare flag, false/None omitted, dicts and lists as compact JSON)."""
    out: list[str] = []
    for key, val in args.items():
        flag = "--" + norm(key)
        if val is None or val is False:
            continue
        if val is True:
            out.append(flag)
        elif isinstance(val, (dict, list)):
            out += [flag, json.dumps(val, separators=(",", ":"))]
        else:
            out += [flag, str(val)]
    return out


@dataclass(frozen=True)
class FlagTable:
    """An engine's flags by canonical name, and every accepted spelling -> canonical name."""

    source: str
    flags: dict[str, FlagSpec]
    spell: dict[str, str]

    def spec(self, flag: str) -> FlagSpec | None:
        canon = self.spell.get(norm(flag))
        return self.flags.get(canon) if canon else None


@cache
def load_engine_env() -> dict[str, dict[str, Any]]:
    """The documented engine environment variables, from `engines/data/engine-env.yaml`:
    {name: {"engine", "type" (bool values are checked), "doc"}}."""
    return yamlio.safe_load((DATA / "engine-env.yaml").read_text())


@cache
def load_table(kind: str) -> FlagTable:
    """The flag table of engine `kind` from `engines/data/<kind>-flags.txt` (first line: its source)."""
    text = (DATA / f"{kind}-flags.txt").read_text()
    source = text.splitlines()[0].lstrip("# ").strip()
    body = "\n".join(ln for ln in text.splitlines() if not ln.startswith("#"))
    flags: dict[str, FlagSpec] = {}
    for name, spec in _parse_table(body).items():
        flags.setdefault(name, spec)
    spell: dict[str, str] = {}
    for name, spec in flags.items():
        spell[name] = name
        for a in spec.aliases:
            spell.setdefault(a, name)
        if spec.kind == "bool":
            spell.setdefault("no-" + name, name)
    return FlagTable(source, flags, spell)


def check_value(spec: FlagSpec, key: str, val: Any, auto_ok: bool = False) -> list[str]:
    """Problems with one flag's value against its kind ([] = fine). `auto_ok`: the profile
    derives this flag's value from `auto` (`EngineProfile.apply_derived`)."""
    if val is None or val is False:
        if val is False and spec.kind not in ("flag", "bool"):
            return [f"{key}: false omits the flag; remove it or give a value"]
        return []
    if spec.kind in ("flag", "bool"):
        return [] if val is True else [f"{key}: a switch takes true or false, got {val!r}"]
    if val is True:
        return [f"{key}: needs a value (true would pass it bare)"]
    if spec.kind == "json":
        v = json_value(val)
        if not isinstance(v, (dict, list)):
            return [f"{key}: expected a mapping (passed as JSON), got {val!r}"]
        return []
    if isinstance(val, (dict, list)):
        if spec.kind == "list":
            return [f"{key}: a list would be passed as one JSON string; give a single value"]
        if spec.kind in ("int", "float"):
            return [f"{key}: expected a single value, got {type(val).__name__}"]
        return []  # many string-typed flags parse JSON (limit-mm-per-prompt, json-model-override-args)
    if val == AUTO and auto_ok:
        return []
    if spec.kind == "int":
        if isinstance(val, bool) or not (isinstance(val, int) or (isinstance(val, str) and re.fullmatch(r"-?\d+", val))):
            return [f"{key}: expected an integer, got {val!r}"]
    if spec.kind == "float":
        if isinstance(val, bool) or not isinstance(val, (int, float)):
            try:
                float(val)
            except (TypeError, ValueError):
                return [f"{key}: expected a number, got {val!r}"]
    return []
