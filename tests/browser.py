"""Open a page in headless Chromium (Debian's, driven by playwright; no browser download) the
way a reader would: images that load, console errors, requests that leave the page. A test
helper: the library never imports playwright."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def check_in_browser(path: str | Path, screenshot: str | Path | None = None, *, chromium: str = "/usr/bin/chromium",
                     full_page: bool = False, width: int = 1200, height: int = 900,
                     timeout_ms: int = 30000) -> dict[str, Any]:
    """Open the page in headless Chromium (no network: every non-file, non-data request is
    blocked and reported). Returns:
        images, broken_images (naturalWidth == 0), console_errors (console error messages and
        uncaught page errors), failed_requests (URLs), external_requests (URLs the page tried
        to fetch from anywhere but file:/data:), title, errors (error outputs shown on the
        page), traceback (a Python traceback is visible).
    Raises RuntimeError if Chromium cannot be started."""
    from playwright.sync_api import sync_playwright

    args = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync"]
    console: list[str] = []
    failed: list[str] = []
    external: list[str] = []

    def route(r: Any) -> None:
        url = r.request.url
        if url.startswith(("file:", "data:", "blob:", "about:")):
            r.continue_()
        else:
            external.append(url)
            r.abort()

    with sync_playwright() as p:
        try:
            b = p.chromium.launch(executable_path=chromium, headless=True, args=args)
        except Exception as e:
            raise RuntimeError(f"cannot start Chromium at {chromium}: {e}") from e
        try:
            page = b.new_page(viewport={"width": width, "height": height})
            page.on("console", lambda m: console.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: console.append(f"page error: {e}"))
            page.on("requestfailed", lambda r: failed.append(r.url))
            page.route("**/*", route)
            page.goto(Path(path).resolve().as_uri(), wait_until="load", timeout=timeout_ms)
            res = page.evaluate("""() => {
                const imgs = Array.from(document.images);
                const broken = imgs.filter(i => !(i.complete && i.naturalWidth > 0)).length;
                const errs = Array.from(document.querySelectorAll('.sl-error, .output_error, .jp-RenderedText[data-mime-type="application/vnd.jupyter.stderr"]'))
                    .map(e => e.innerText.slice(0, 200));
                const tb = document.body.innerText.includes('Traceback (most recent call last)');
                return {images: imgs.length, broken_images: broken, errors: errs, traceback: tb, title: document.title};
            }""")
            if screenshot:
                page.screenshot(path=str(screenshot), full_page=full_page)
        finally:
            b.close()
    res.update(console_errors=console, failed_requests=failed, external_requests=external)
    return res
