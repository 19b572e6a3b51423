"""The README's commands that need no server, executed as a new user types them (after `make test`'s
set-up): every block marked `readme-commands` (one per journey, run as one sequence in document order) and
the papermill block, each line in order, from the repository root. Runs and reports go to temporary folders, so the committed reports stay untouched. The block's
`servelab report --all` re-renders every published report from its committed data alone (no
server, no GPU): each page byte for byte the committed one (a re-render leaves git clean). These run
in the pass without an engine, beside the other tests (they keep both cores busy, and that pass
leaves a third of them idle); the block that starts servers: test_readme_servers.py."""

from __future__ import annotations

import pytest
from paths import ROOT
from readme import REPORT_ALL, block, environment, run_lines

PUBLISHED = sorted(p.parent.parent.name for p in (ROOT / "reports").glob("*/data/study.json"))
pytestmark = pytest.mark.notebooks


def test_the_using_it_commands_work_as_written(readme_commands):
    lines = block("readme-commands")
    assert any("--dry-run" in ln for ln in lines) and not any(ln.startswith(("servelab run", "servelab calibrate"))
                                                              and "--dry-run" not in ln for ln in lines)
    assert any(ln.startswith(REPORT_ALL) for ln in lines) and any(ln.startswith("servelab report local-cpu-kv")
                                                                  for ln in lines)
    base, after = readme_commands  # every line exited 0 (the fixture checks each)
    page = "local-cpu-kv/index.html"
    committed = (ROOT / "reports" / page).read_bytes()
    # rendered twice, in two processes (alone, then beside the other studies): the same bytes, the committed page
    assert after["servelab report local-cpu-kv"][page] == after[REPORT_ALL][page] == committed
    assert set(after[REPORT_ALL]) >= {page, "index.html", "local-cpu-kv/index.ja.html"}
    assert not (base / "runs").exists()  # nothing in the block measured anything


def test_the_papermill_commands_work_as_written(tmp_path):
    lines = block("readme-papermill")
    assert sum("papermill" in ln for ln in lines) >= 2 and any(ln.startswith("for study in") for ln in lines)
    for p in (ROOT / "runs" / "papermill").glob("*.ipynb"):
        p.unlink()
    run_lines(lines, environment(tmp_path))
    out = ROOT / "runs" / "papermill"
    assert {p.name for p in out.glob("writeup-*.ipynb")} == {"writeup-local-cpu-kv.ipynb", "writeup-h200-llama8b-vllm.ipynb"}
    assert "kv-tight" in (out / "04_kv-tight.ipynb").read_text()


@pytest.mark.parametrize("study", PUBLISHED)
def test_rerender_is_byte_identical_to_the_committed_page(study, readme_commands):
    """`servelab report --all` (the README's line, every study rendered in its own process beside
    the others) writes each committed page again byte for byte; the KV study's page is also
    rendered alone before it (the test above: the same bytes both times)."""
    _, after = readme_commands
    rendered = after[REPORT_ALL]
    pages = sorted(p.name for p in (ROOT / "reports" / study).glob("index*.html"))
    assert pages
    for p in pages:
        assert rendered[f"{study}/{p}"] == (ROOT / "reports" / study / p).read_bytes(), \
            f"{study}/{p} differs from the committed page"
