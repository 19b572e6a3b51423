"""Where the tests find the repository and their fixtures, whatever folder a test file sits in
(imported as `from paths import ROOT, FIXTURES`, like browser.py and conftest's helpers)."""
from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
FIXTURES = TESTS / "fixtures"
