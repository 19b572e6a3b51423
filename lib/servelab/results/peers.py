"""Peer tools' result files read into servelab-shaped records, one call per file: `vllm bench serve`
JSON (or the JSON lines of `--append-result`), GuideLLM's `benchmarks.json`, SGLang bench_serving
JSON lines. What the records are and how each tool's numbers map is `analysis.peers` and
`analysis.sglang_bench`; this module only reads. `servelab import` reads the same files through
`results.formats` (which also tells the tool and its version); these are the readers a benchmark
script or a test calls with a path. Not for the arithmetic (`analysis`)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd

from ..analysis.peers import guidellm_frame, json_objects, vllm_bench_frame
from ..analysis.sglang_bench import sglang_bench_frame


def read_objects(path: Path | str) -> list[dict[str, Any]]:
    """A result file's objects: one JSON document (a list: its items), else its JSON lines."""
    return json_objects(Path(path).read_text(encoding="utf-8"))


def _objects(paths: Path | str | Iterable[Path | str]) -> list[dict[str, Any]]:
    return [o for p in ([paths] if isinstance(paths, (str, Path)) else paths) for o in read_objects(p)]


def import_vllm_bench(json_path: Path | str | Iterable[Path | str], *, config: str, bucket_label: str | None = None,
                      target_input_tokens: int | None = None, target_output_tokens: int | None = None) -> pd.DataFrame:
    """`vllm bench serve --save-result --save-detailed` JSON file(s) -> servelab-shaped records
    (`analysis.peers.vllm_bench_frame`); several files or JSON lines become rounds 0, 1, ..."""
    return vllm_bench_frame(_objects(json_path), config=config, bucket_label=bucket_label,
                            target_input_tokens=target_input_tokens, target_output_tokens=target_output_tokens)


def import_guidellm(json_path: Path | str, *, config: str, bucket_label: str | None = None) -> pd.DataFrame:
    """GuideLLM `benchmarks.json` -> servelab-shaped records (`analysis.peers.guidellm_frame`);
    each benchmark (strategy) is a level."""
    return guidellm_frame(read_objects(json_path), config=config, bucket_label=bucket_label)


def import_sglang_bench(path: Path | str | Iterable[Path | str], *, config: str,
                        bucket_label: str | None = None) -> pd.DataFrame:
    """``sglang.bench_serving --output-file X.jsonl --output-details`` file(s) -> servelab-shaped
    records (`analysis.sglang_bench.sglang_bench_frame`); each JSON line (one run) is a round."""
    return sglang_bench_frame(_objects(path), config=config, bucket_label=bucket_label)
