"""The tool definitions table (data/tool_definitions.yaml) is validated like params: unknown keys,
metrics servelab does not define and unexplained differences are errors naming the key path."""

from __future__ import annotations

import copy

import pytest
import yaml

from servelab.schema import ParamsError
from servelab.schema.tools import TOOL_DEFINITIONS_PATH, load_tool_definitions, parse_tool_definitions

BASE = yaml.safe_load(TOOL_DEFINITIONS_PATH.read_text())


def test_the_shipped_table_loads():
    d = load_tool_definitions()
    assert d.of("guidellm").percentiles == "inverted_cdf"
    assert d.of("aiperf").figures[0].field == "time_to_first_token.p50"
    with pytest.raises(KeyError, match="no definitions for tool 'genai-perf'"):
        d.of("genai-perf")


@pytest.mark.parametrize("change, expect", [
    (lambda d: d["tools"][0]["figures"][0].update(colour="red"), "colour"),
    (lambda d: d["tools"][0]["figures"][0].update(metric="ttft_ms"), "ttft_ms"),
    (lambda d: d["tools"][1]["figures"][0].pop("why"), "must say why"),
    (lambda d: d["tools"][1]["figures"][0].pop("differs"), "name the difference"),
    (lambda d: d["tools"][0]["figures"][0].update(by_tool={"window": "tomorrow"}), "window"),
    (lambda d: d["tools"][1].update(percentiles="nearest"), "percentiles"),
    (lambda d: d["tools"][1]["not_recomputable"].update(itl_ms="x"), "itl_ms"),
])
def test_a_bad_table_is_a_params_error(change, expect):
    d = copy.deepcopy(BASE)
    change(d)
    with pytest.raises(ParamsError, match=expect):
        parse_tool_definitions(d, "tool_definitions.yaml")
