"""The definitions table of other benchmark tools (`data/tool_definitions.yaml`): for each tool whose
results servelab imports, the headline figures it reports, each with the servelab metric it stands
for, the statistic, the tool's own definition and whether it matches servelab's; where it does
not, the definition that differs, named (`differs`: duration window, percentile method, ...), why,
and how servelab recomputes the figure by the tool's definition (`by_tool`) to check that the named
difference is the whole difference; and which of servelab's metrics its per-request data cannot give. Validated like params: an unknown key is an error, every metric must
be one the table's `servelab:` block defines (analysis.harmonise holds that block to
`summary.DEFINED_METRICS`), and a figure that differs must say why."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from . import parse_table, read_table
from .parts import Strict

TOOL_DEFINITIONS_PATH = Path(__file__).resolve().parents[1] / "data" / "tool_definitions.yaml"

Stat = Literal["p50", "p95", "mean", "value"]


class ByTool(Strict):
    """How servelab recomputes a figure by the tool's own definition from the imported records."""

    values: str | None = Field(None, description="the record column holding the tool's per-request value "
                               "(default: the servelab metric's); `itl_s+role_gap`: servelab's pooled gaps and "
                               "the role-chunk gap vLLM counts; `none`: the file does not keep it (not checked)")
    weights: Literal["output_tokens", "output_tokens-1"] | None = Field(
        None, description="the tool weights each request's value by its tokens (GuideLLM 0.4+)")
    window: Literal["successful", "token_span"] | None = Field(
        None, description="a run's throughput over the tool's window: `successful` (first successful request -> "
        "last successful response, AIPerf), `token_span` (first token -> last token of the measured requests, "
        "GuideLLM)")


class Figure(Strict):
    metric: str = Field(..., description="the servelab metric it stands for (a key of `servelab:`)")
    field: str = Field(..., description="where the tool's summary holds it (as the importer names it)")
    label: str = Field(..., description="the tool's own name for it")
    stat: Stat = Field(..., description="the statistic: p50, p95, mean, or value (one number per run)")
    definition: str = Field(..., description="the tool's definition, in its own terms")
    same: bool = Field(..., description="true: the definition is servelab's, so the numbers must agree")
    differs: str | None = Field(None, description="the definition that differs, named (required unless same): "
                                "duration window, percentile method, stream end, role chunk, TPOT vs ITL, ...")
    why: str | None = Field(None, description="what differs from servelab's definition (required unless same)")
    by_tool: ByTool = Field(default_factory=ByTool, description="how servelab recomputes it by the tool's definition")
    tolerance_pct: float = Field(2.0, gt=0, description="a larger difference is flagged (same definitions)")
    no_decode_why: str | None = Field(None, description="why the figure differs where a request had no decode time "
                                      "(its whole output in one chunk): how the tool counts such a request")

    @model_validator(mode="after")
    def _check(self) -> "Figure":
        if not self.same and not (self.why and self.differs):
            raise ValueError(f"{self.field}: a figure whose definition differs must say why and name the "
                             "difference (differs: duration window, percentile method, ...)")
        return self


class Tool(Strict):
    tool: str = Field(..., description="the --tool name of `servelab import`")
    name: str = Field(..., description="the tool as a reader knows it")
    versions: str = Field(..., description="the versions whose format this describes")
    files: str = Field(..., description="what to import, and how to make it")
    percentiles: Literal["linear", "inverted_cdf"] = Field(
        "linear", description="how the tool computes a percentile: linear (numpy's default, as servelab) or "
        "inverted_cdf (the first sample value whose cumulative share reaches p)")
    figures: list[Figure] = Field(..., min_length=1)
    not_recomputable: dict[str, str] = Field(default_factory=dict,
                                             description="servelab metric -> why its per-request data cannot give it")


class ToolDefinitions(Strict):
    servelab: dict[str, str] = Field(..., description="servelab's own definition of each metric")
    tools: list[Tool] = Field(..., min_length=1)

    @model_validator(mode="after")
    def _known(self) -> "ToolDefinitions":
        for t in self.tools:
            bad = [f.metric for f in t.figures if f.metric not in self.servelab]
            bad += [m for m in t.not_recomputable if m not in self.servelab]
            if bad:
                raise ValueError(f"{t.tool}: {sorted(set(bad))} are not metrics servelab defines "
                                 f"({', '.join(self.servelab)})")
        return self

    def of(self, tool: str) -> Tool:
        for t in self.tools:
            if t.tool == tool:
                return t
        raise KeyError(f"no definitions for tool {tool!r}; have {[t.tool for t in self.tools]}")


def parse_tool_definitions(data: dict[str, Any], source: str = "tool definitions") -> ToolDefinitions:
    """The table from a mapping; ParamsError naming the key path on any problem."""
    return parse_table(ToolDefinitions, data, source)


@cache
def load_tool_definitions(path: str | None = None) -> ToolDefinitions:
    return read_table(ToolDefinitions, Path(path) if path else TOOL_DEFINITIONS_PATH)


__all__ = ["ByTool", "Figure", "Tool", "ToolDefinitions", "load_tool_definitions", "parse_tool_definitions"]
