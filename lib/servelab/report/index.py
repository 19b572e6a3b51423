"""reports/index.html listing every published study. Not for rendering a study's own page
(`render.notebook_to_html`)."""

from __future__ import annotations

import html
import json
from pathlib import Path

from ..runfolder import RUN_JSON, RunFolder, read_json


def write_index(reports_root: Path) -> Path:
    """reports/index.html listing every published study."""
    rows = []
    for d in sorted(p for p in Path(reports_root).iterdir() if (p / "index.html").exists() and (p / "data").is_dir()):
        try:
            st = read_json(d / "data" / "study.json")["study"]
        except (OSError, KeyError, json.JSONDecodeError):
            continue
        runs = [RunFolder(c).info for c in sorted((d / "data").iterdir()) if (c / RUN_JSON).exists()]
        when = max((r.finished_at or "" for r in runs), default="")
        planned = len(st.get("configurations", []))
        measured = planned if len(runs) >= planned else f"{len(runs)} of {planned}"  # a run of some (--config)
        rows.append(f"<tr><td><a href='{html.escape(d.name)}/index.html'>{html.escape(d.name)}</a></td>"
                    f"<td>{html.escape(st.get('title', ''))}</td><td>{measured}</td>"
                    f"<td>{html.escape(when)}</td></tr>")
    page = ("<!doctype html><html><head><meta charset='utf-8'><title>servelab reports</title>"
            "<style>body{font-family:sans-serif;max-width:60em;margin:2em auto}td,th{padding:.3em .8em;"
            "border-bottom:1px solid #ddd;text-align:left}</style></head><body><h1>servelab reports</h1>"
            "<table><tr><th>study</th><th>title</th><th>configurations</th><th>measured</th></tr>"
            + "".join(rows) + "</table></body></html>\n")
    out = Path(reports_root) / "index.html"
    out.write_text(page, encoding="utf-8")
    return out
