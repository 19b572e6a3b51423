"""reports/index.html: one row per published study; a study published from some of its configurations
(`servelab run --config a,b`) says how many of how many."""

from __future__ import annotations

import json

from servelab.report.index import write_index


def _study(root, name, planned, measured):
    data = root / name / "data"
    data.mkdir(parents=True)
    (root / name / "index.html").write_text("<html></html>")
    (data / "study.json").write_text(json.dumps({"study": {"title": name.upper(),
                                                            "configurations": [{"id": f"c{i}"} for i in range(planned)]}}))
    for i in range(measured):
        (data / f"c{i}").mkdir()
        (data / f"c{i}" / "run.json").write_text(json.dumps({"status": "complete", "finished_at": f"2026-12-0{i + 1}"}))


def test_a_study_of_some_configurations_says_how_many_of_how_many(tmp_path):
    _study(tmp_path, "all", 2, 2)
    _study(tmp_path, "some", 7, 5)
    page = write_index(tmp_path).read_text()
    assert "<td>ALL</td><td>2</td>" in page and "<td>SOME</td><td>5 of 7</td>" in page
