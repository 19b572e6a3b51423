"""scripts/uv_args.py: uv is handed what pip is configured with (index, local wheels, constraints)."""

from __future__ import annotations

import importlib.util

from paths import ROOT

_spec = importlib.util.spec_from_file_location("uv_args", ROOT / "scripts" / "uv_args.py")
uv_args = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(uv_args)


def test_pip_configuration_becomes_uv_options():
    cfg = """:env:.cert='/etc/ssl/certs/ca-certificates.crt'
:env:.default-timeout='180'
:env:.find-links='/opt/wheels'
global.constraint='/etc/xdg/pip/constraints.txt'
global.extra-index-url='file:///opt/pypi/simple file:///opt/pypi-more/simple'
global.find-links='/opt/wheels'
"""
    assert uv_args.uv_args(cfg) == [
        "--find-links", "/opt/wheels", "--constraint", "/etc/xdg/pip/constraints.txt",
        "--extra-index-url", "file:///opt/pypi/simple", "--extra-index-url", "file:///opt/pypi-more/simple",
        "--index-strategy", "unsafe-best-match"]


def test_no_pip_configuration_is_uv_defaults():
    assert uv_args.uv_args("") == ["--index-strategy", "unsafe-best-match"]
    assert uv_args.uv_args("global.index-url='https://mirror/simple'\n")[:2] == ["--index-url", "https://mirror/simple"]
