"""The README's picture: the first screen of the default study's published page
(reports/local-cpu/index.html), as headless Chromium (Debian's, driven by playwright) shows it, saved as
docs/img/local-cpu.png.

Deterministic: a fixed viewport and scale, the page's own fonts (no web font: the page fetches nothing),
no scrollbar, no caret, no animation, sRGB colours, software rendering; the page itself shows no time of
rendering on its first screen. The same page on the same machine gives the same bytes, so

    .venv/bin/python scripts/readme_screenshot.py            # write docs/img/local-cpu.png
    .venv/bin/python scripts/readme_screenshot.py --check    # exit 1 when the committed picture is not this page's

`--check` is what tests/e2e/test_published.py runs after a page is re-rendered.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "reports" / "local-cpu" / "index.html"
PICTURE = ROOT / "docs" / "img" / "local-cpu.png"
VIEWPORT = {"width": 1200, "height": 785}  # the title, the question and the opening figure with its legend
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--hide-scrollbars", "--force-color-profile=srgb",
        "--font-render-hinting=none", "--disable-font-subpixel-positioning", "--disable-lcd-text"]


def screenshot(page: Path = PAGE, *, chromium: str = CHROMIUM) -> bytes:
    """PNG bytes of the first screen of `page` (no request leaves the machine: anything but file: and
    data: is aborted)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True, args=ARGS)
        try:
            ctx = browser.new_context(viewport=VIEWPORT, device_scale_factor=1, reduced_motion="reduce",
                                      color_scheme="light", locale="en-US", timezone_id="UTC")
            tab = ctx.new_page()
            tab.route("**/*", lambda r: r.continue_() if r.request.url.startswith(("file:", "data:"))
                      else r.abort())
            tab.goto(page.resolve().as_uri(), wait_until="load")
            tab.evaluate("document.fonts.ready")
            return tab.screenshot(animations="disabled", caret="hide")
        finally:
            browser.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="compare with the committed picture instead of writing it")
    ap.add_argument("--page", type=Path, default=PAGE)
    ap.add_argument("--out", type=Path, default=PICTURE)
    a = ap.parse_args(argv)
    png = screenshot(a.page)
    if a.check:
        same = a.out.exists() and a.out.read_bytes() == png
        print(f"{a.out}: {'the page as it is' if same else 'differs from the page: run scripts/readme_screenshot.py'}")
        return 0 if same else 1
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_bytes(png)
    print(f"{a.out}: {len(png):,} bytes, {VIEWPORT['width']} x {VIEWPORT['height']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
