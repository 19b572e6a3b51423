"""Tests for servelab.prompts: the shipped prompt sets and their validation in a bucket."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from servelab.prompts import PromptSet, list_sets, load_set
from servelab.schema import Bucket, QualityParams


def test_the_shipped_sets():
    assert list_sets() == ["code", "lists", "quality", "questions", "rewrite"]
    sizes = {n: len(load_set(n).prompts) for n in list_sets()}
    assert all(6 <= v <= 10 for k, v in sizes.items() if k != "quality"), sizes
    assert 12 <= sizes["quality"] <= 20
    assert load_set("rewrite").kind == "copy" and load_set("code").kind == "free"
    assert all(p.expected for p in load_set("quality").prompts)  # every known-answer task has its answer
    assert not any(p.expected for n in ("rewrite", "questions", "lists", "code") for p in load_set(n).prompts)


def test_rewrite_prompts_hold_the_text_to_copy():
    # copy-heavy: a task line, a blank line, then the paragraph the answer repeats
    for p in load_set("rewrite").prompts:
        task, _, paragraph = p.text.partition("\n\n")
        assert len(paragraph.split()) >= 40, p.id


def test_unknown_set_is_an_error_with_a_suggestion():
    with pytest.raises(KeyError, match="unknown prompt set 'rewrites'"):
        load_set("rewrites")
    with pytest.raises(ValidationError, match="did you mean 'rewrite'"):
        Bucket(prompt_set="rewrites", output_tokens=64)
    with pytest.raises(ValidationError, match="unknown prompt set"):
        QualityParams(sets=["quality", "nope"])


def test_bucket_source_and_stop_rules():
    with pytest.raises(ValidationError, match="a prompt_set bucket sends the set's own prompts; remove input_tokens"):
        Bucket(input_tokens=100, prompt_set="code", output_tokens=64)
    with pytest.raises(ValidationError, match=r"input_tokens\n  Field required"):
        Bucket(output_tokens=64)
    with pytest.raises(ValidationError, match="contradicts"):
        Bucket(prompt_set="code", output_tokens=64, stop="eos", ignore_eos=True)
    b = Bucket(prompt_set="code", output_tokens=64)
    assert b.label == "code-out64" and b.ignores_eos(True) is False  # a prompt set stops at EOS by default
    assert Bucket(prompt_set="code", output_tokens=64, ignore_eos=True).ignores_eos(False) is True
    assert Bucket(prompt_set="code", output_tokens=64, stop="length").ignores_eos(False) is True
    assert Bucket(input_tokens=32, output_tokens=8).ignores_eos(True) is True  # the filler: the workload's flag
    assert Bucket(input_tokens=32, output_tokens=8).ignores_eos(False) is False


def test_a_set_needs_unique_ids_and_one_source_per_prompt():
    with pytest.raises(ValidationError, match="duplicate ids"):
        PromptSet(name="x", description="d", kind="free", prompts=[{"id": "a", "text": "t"}, {"id": "a", "text": "u"}])
    with pytest.raises(ValidationError, match="exactly one of 'text' or 'messages'"):
        PromptSet(name="x", description="d", kind="free", prompts=[{"id": "a"}])
