"""The CLI's edge: a user error prints one line and exits 2, with a traceback only under --debug;
progress lines go through one logger (servelab.log) as `[servelab] ...`."""

from __future__ import annotations

import subprocess
import sys

from paths import ROOT

NO_RAY = ("import builtins, sys\n"
          "real = builtins.__import__\n"
          "def fake(name, *a, **k):\n"
          "    if name == 'ray' or name.startswith('ray.'):\n"
          "        raise ModuleNotFoundError(\"No module named 'ray'\", name='ray')\n"
          "    return real(name, *a, **k)\n"
          "builtins.__import__ = fake\n"
          "from servelab.cli import main\n"
          "sys.exit(main(sys.argv[1:]))\n")


def _cli(*args: str, code: str | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-c", code, *args] if code else [sys.executable, "-m", "servelab.cli", *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_a_params_file_that_does_not_exist_is_one_line_and_exit_2():
    r = _cli("run", "params/does-not-exist.yaml")
    assert r.returncode == 2
    assert r.stderr.strip() == "params/does-not-exist.yaml: no such params file"


def test_calibrate_with_ray_but_no_ray_is_one_line_and_exit_2():
    r = _cli("calibrate", "--ray", "--levels", "1", "--tokens", "4", code=NO_RAY)
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.strip().splitlines() if not ln.startswith("[servelab]")]
    assert len(lines) == 1 and "Traceback" not in r.stderr
    assert lines[0].startswith("servelab calibrate: ray is not installed") and "pip install 'servelab[ray]'" in lines[0]


def test_debug_shows_the_traceback():
    r = _cli("--debug", "calibrate", "--ray", "--levels", "1", "--tokens", "4", code=NO_RAY)
    assert r.returncode != 0 and "Traceback" in r.stderr and "MissingExtra" in r.stderr


def test_progress_lines_have_one_format(capsys):
    from servelab.log import progress_line, set_level

    progress_line("level 1/4 rewrite c=1: 3 measured requests")
    set_level(quiet=True)
    progress_line("not shown")
    set_level()
    assert capsys.readouterr().err == "[servelab] level 1/4 rewrite c=1: 3 measured requests\n"


def test_no_servelab_print_left_in_the_library():
    found = [f"{p.relative_to(ROOT)}:{i}" for p in sorted((ROOT / "lib" / "servelab").rglob("*.py"))
             for i, ln in enumerate(p.read_text().splitlines(), 1) if "print(" in ln and "[servelab]" in ln]
    assert found == []
