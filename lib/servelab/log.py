"""One configured logger: every progress line servelab writes goes through `logging` (the
"servelab" logger), formatted once as `[servelab] message` on stderr, the lines the pipeline
forwards from a stage notebook's kernel. `set_level` is the CLI's --quiet / --verbose. Not for
results (those are files) nor for errors (raised as `errors.ServelabError`)."""

from __future__ import annotations

import logging
import sys

LOGGER = logging.getLogger("servelab")
FORMAT = "[servelab] %(message)s"


class _Lines(logging.Handler):
    """servelab's own handler: writes to whatever sys.stderr is when a line is logged (a notebook
    kernel or a test may have replaced it since), flushed at once."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(self.format(record) + "\n")
            sys.stderr.flush()
        except Exception:  # logging's own contract: a failing handler reports, never raises
            self.handleError(record)


def _handler() -> None:
    if not any(isinstance(h, _Lines) for h in LOGGER.handlers):
        h = _Lines()
        h.setFormatter(logging.Formatter(FORMAT))
        LOGGER.addHandler(h)
        LOGGER.propagate = False
        if LOGGER.level == logging.NOTSET:
            LOGGER.setLevel(logging.INFO)


def progress_line(msg: str) -> None:
    """One progress line (`[servelab] msg` on stderr, flushed)."""
    _handler()
    LOGGER.info(msg)


def debug(msg: str) -> None:
    _handler()
    LOGGER.debug(msg)


def set_level(quiet: bool = False, verbose: bool = False) -> None:
    """--quiet: warnings only; --verbose: debug lines too."""
    _handler()
    LOGGER.setLevel(logging.WARNING if quiet else logging.DEBUG if verbose else logging.INFO)
