"""reports/index.html listing every published study, and the executed write-up turned into
a standalone page."""

from __future__ import annotations

import html
import json
from pathlib import Path

from ..runfolder import RUN_JSON, read_json


def notebook_to_html(nb_path: Path, out: Path, title: str = "servelab report", language: str | None = None,
                     alternate: dict[str, str] | None = None) -> Path:
    """Executed write-up -> a standalone page (servelab template, inputs hidden, figures embedded,
    no external resource, byte-identical for the same notebook), scrubbed of secrets."""
    from ..secrets import scrub
    from .render import notebook_to_html as render

    return render(nb_path, out, title=title, language=language, alternate=alternate, scrub=scrub)


def write_index(reports_root: Path) -> Path:
    """reports/index.html listing every published study."""
    rows = []
    for d in sorted(p for p in Path(reports_root).iterdir() if (p / "index.html").exists() and (p / "data").is_dir()):
        try:
            st = read_json(d / "data" / "study.json")["study"]
        except (OSError, KeyError, json.JSONDecodeError):
            continue
        runs = [read_json(c / RUN_JSON) for c in sorted((d / "data").iterdir()) if (c / RUN_JSON).exists()]
        when = max((r.get("finished_at") or "" for r in runs), default="")
        rows.append(f"<tr><td><a href='{html.escape(d.name)}/index.html'>{html.escape(d.name)}</a></td>"
                    f"<td>{html.escape(st.get('title', ''))}</td><td>{len(st.get('configurations', []))}</td>"
                    f"<td>{html.escape(when)}</td></tr>")
    page = ("<!doctype html><html><head><meta charset='utf-8'><title>servelab reports</title>"
            "<style>body{font-family:sans-serif;max-width:60em;margin:2em auto}td,th{padding:.3em .8em;"
            "border-bottom:1px solid #ddd;text-align:left}</style></head><body><h1>servelab reports</h1>"
            "<table><tr><th>study</th><th>title</th><th>configurations</th><th>measured</th></tr>"
            + "".join(rows) + "</table></body></html>\n")
    out = Path(reports_root) / "index.html"
    out.write_text(page, encoding="utf-8")
    return out
