"""Prompt calibration: exact token targets through /tokenize or a local tokenizer."""

from __future__ import annotations

import pytest

from servelab.measure.refserver import TEMPLATE_TOKENS
from servelab.measure.workload import LocalTokenizer, ServerTokenizer, calibrate, token_counter

FILLER = "This is deterministic benchmark input text."


class CharCounter:
    """Counts 1 token per 3 characters plus a 7-token template: words do not map 1:1."""

    name = "chars/3"

    def __init__(self):
        self.calls = 0

    def count(self, prompt: str) -> int:
        self.calls += 1
        return 7 + (len(prompt) + 2) // 3


@pytest.mark.parametrize("target", [8, 32, 256, 2048, 8192])
def test_calibrate_hits_target_exactly_with_word_counter(refserver, target):
    s = refserver()
    c = ServerTokenizer(s.url, "ref")
    cal = calibrate(c, target, FILLER)
    assert cal.tokens == target
    assert len(cal.prompt.split()) == target - TEMPLATE_TOKENS
    assert cal.counter == "server /tokenize"
    assert cal.probes < 40  # exponential + binary search, not a linear scan


@pytest.mark.parametrize("target", [20, 100, 1000, 5000])
def test_calibrate_within_one_token_with_coarse_counter(target):
    c = CharCounter()
    cal = calibrate(c, target, FILLER)
    assert target - 1 <= cal.tokens <= target
    assert c.count(cal.prompt) == cal.tokens


def test_calibrate_rejects_target_below_template(refserver):
    s = refserver()
    with pytest.raises(ValueError, match="chat template"):
        calibrate(ServerTokenizer(s.url, "ref"), 3, FILLER)


def test_falls_back_to_local_tokenizer(refserver, cpu_model_dir):
    s = refserver(tokenize=False)
    warnings: list[str] = []
    c = token_counter(s.url, "ref", "chat", None, str(cpu_model_dir), warn=warnings.append)
    assert isinstance(c, LocalTokenizer) and warnings and "no usable /tokenize" in warnings[0]
    cal = calibrate(c, 300, FILLER)
    assert abs(cal.tokens - 300) <= 2


def test_no_tokenize_and_no_tokenizer_is_a_clear_error(refserver):
    s = refserver(tokenize=False)
    with pytest.raises(ValueError, match="no /tokenize"):
        token_counter(s.url, "ref", "chat", None, None)
