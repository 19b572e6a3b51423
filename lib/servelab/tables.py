"""The shipped tables the numbers are computed with, read from `data/` once: the accelerators'
datasheet peaks (hardware.yaml), the dated calibration entries of machines (calibrations/*.yaml,
written by `servelab calibrate-hw`) and the performance model's engine terms (engine_terms.yaml),
each as written. Not for their units or their arithmetic (`analysis.roofline`,
`analysis.calibration`, `analysis.perfmodel_terms`), nor for prices (`prices`)."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

from . import yamlio

DATA = Path(__file__).resolve().parent / "data"
HARDWARE_PATH = DATA / "hardware.yaml"
CALIBRATIONS = DATA / "calibrations"
TERMS_PATH = DATA / "engine_terms.yaml"


def hardware() -> list[dict[str, Any]]:
    """data/hardware.yaml's entries, datasheet units (GB, TB/s, TFLOPS)."""
    return yamlio.safe_load(HARDWARE_PATH.read_text(encoding="utf-8"))


@cache
def _calibrations(folder: str) -> tuple[dict[str, Any], ...]:
    out = []
    for p in sorted(Path(folder).glob("*.yaml")):
        d = yamlio.safe_load(p.read_text(encoding="utf-8"))
        d.setdefault("id", p.stem)
        out.append(d)
    return tuple(out)


def calibration_entries(folder: Path | str | None = None) -> tuple[dict[str, Any], ...]:
    """Every calibration entry of `folder` (data/calibrations/), by file name, each with its `id`
    (the file's stem where the entry names none); read once per folder."""
    return _calibrations(str(folder or CALIBRATIONS))


@cache
def _terms(path: str) -> tuple[dict[str, Any], ...]:
    d = yamlio.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    return tuple(d.get("terms") or [])


def engine_terms(path: Path | str | None = None) -> tuple[dict[str, Any], ...]:
    """The `terms` of data/engine_terms.yaml (or of `path`), read once."""
    return _terms(str(path or TERMS_PATH))
