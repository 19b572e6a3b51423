#!/usr/bin/env python3
# Copied on 2026-12-01 from ../shared/gpu/resolve-wheels.py (the GPU runbook's helpers; sha256 8e6db1f4174c4dcf...)
# so that nothing under scripts/device/ refers to ../shared at run time. Unchanged below this header.
"""Download the wheels a package needs on the GPU machine that its image lacks.

Walks Requires-Dist breadth first from the given requirements, skipping what the GPU image
already has (device-pip-list.txt, by name) and names given with --skip, and downloads each
missing wheel (python 3.12, manylinux x86_64, --no-deps) into OUTDIR. Prints what it fetched,
what it skipped and the total size.

Usage: resolve-wheels.py OUTDIR REQ [REQ ...] [--skip NAME ...] [--pin NAME==VER ...]
"""
import re
import subprocess
import sys
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PLAT = [f"--platform=manylinux_2_{n}_x86_64" for n in (17, 24, 26, 27, 28, 31, 34, 35, 39)] + [
    "--platform=manylinux2014_x86_64", "--platform=manylinux1_x86_64", "--platform=linux_x86_64"]


def norm(n):
    return re.sub(r"[-_.]+", "-", n.lower())


def args_split(argv):
    out, reqs, skip, pins, mode = argv[0], [], set(), {}, "req"
    for a in argv[1:]:
        if a in ("--skip", "--pin"):
            mode = a[2:]
        elif mode == "skip":
            skip.add(norm(a))
        elif mode == "pin":
            n, v = a.split("==")
            pins[norm(n)] = a
        else:
            reqs.append(a)
    return Path(out), reqs, skip, pins


def requires(whl, extras):
    with zipfile.ZipFile(whl) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode()
    out = []
    for line in text.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = line.split(":", 1)[1].strip()
        req, _, marker = req.partition(";")
        m = marker.strip()
        if "extra ==" in m:
            ex = re.findall(r"extra == ['\"]([^'\"]+)['\"]", m)
            if not any(e in extras for e in ex):
                continue
        elif m and ("aarch64" in m and "!=" not in m or "sys_platform == \"win32\"" in m
                    or "sys_platform == 'win32'" in m or "darwin" in m and "!=" not in m
                    or "python_version < \"3." in m and "3.1" not in m):
            continue
        out.append(req.strip())
    return out


def main():
    out, reqs, skip, pins = args_split(sys.argv[1:])
    out.mkdir(parents=True, exist_ok=True)
    device = {norm(l.split("==")[0]) for l in (HERE / "device-pip-list.txt").read_text().splitlines() if "==" in l}
    seen, queue, fetched, skipped = set(), list(reqs), [], []
    while queue:
        req = queue.pop(0)
        name = re.split(r"[<>=!~\[ (]", req, 1)[0]
        extras = set(re.findall(r"\[([^\]]+)\]", req)[0].split(",")) if "[" in req.split(";")[0] else set()
        k = norm(name)
        if k in seen:
            continue
        seen.add(k)
        if k in device or k in skip:
            skipped.append(k)
            continue
        spec = pins.get(k, re.sub(r"\[[^\]]*\]", "", req).replace(" ", "").replace("(", "").replace(")", ""))
        before = set(out.glob("*.whl"))
        r = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                            "--python-version=3.12", "--implementation=cp", *PLAT, "-d", str(out), spec],
                           capture_output=True, text=True)
        new = set(out.glob("*.whl")) - before
        whl = next(iter(new), None) or next((w for w in out.glob("*.whl") if norm(w.name.split("-")[0]) == k), None)
        if r.returncode or whl is None:
            print(f"FAILED {spec}: {r.stderr.strip().splitlines()[-1:] }")
            continue
        fetched.append((whl.name, whl.stat().st_size))
        queue.extend(requires(whl, extras))
    total = sum(s for _, s in fetched)
    for n, s in sorted(fetched, key=lambda x: -x[1]):
        print(f"{s / 2**20:8.1f} MiB  {n}")
    print(f"fetched {len(fetched)} wheels, {total / 2**20:.0f} MiB; on the device or skipped: {sorted(skipped)}")


if __name__ == "__main__":
    main()
