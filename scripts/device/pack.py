"""Pack wheel folders into zstd-compressed streams for the device machine (docs/gpu.md).

A wheel is a deflate zip; stored again without compression and packed in one tar, zstd -9 with a
128 MiB window (--long=27) makes the set about a quarter smaller than the wheels themselves
(vLLM 0.26.0's wheel: 304 MB -> 221 MB), which saves device calls: at most 64 MiB travels per call,
the working tree included. pip installs a stored wheel like any other (RECORD hashes are of the
files' contents, not of their compression).

Usage (here, from the repository root):
  python3 scripts/device/pack.py .gpu/packed --stream v .gpu/wheels/wheels .gpu/extra \
      --stream s .gpu/sglang-wheels .gpu/sglang-override
  -> .gpu/packed/v.tar.zst, s.tar.zst and MANIFEST.json (wheel names per stream; a wheel already in
     an earlier stream is not packed again and is listed under "shared"); split them just before
     the hold with split-parts (the size that fits depends on the working tree then).
  python3 scripts/device/pack.py .gpu/packed --split PART_MIB [--first-mib M --order v,s]
  -> .gpu/packed/parts/v00 v01 ... s00 ... (one per device call) and SHA256 (of each whole stream)
On the device: scripts/device/step.sh joins, checks, unpacks (zstd, or Python's zstandard) and installs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path


def store(src: Path, dst: Path) -> None:
    """`src` rewritten as an uncompressed zip at `dst` (same members, same order)."""
    with zipfile.ZipFile(src) as zi, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zo:
        for info in zi.infolist():
            zo.writestr(info, zi.read(info), compress_type=zipfile.ZIP_STORED)


def pack(out: Path, streams: list[list[str]]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    seen: dict[str, str] = {}
    manifest: dict[str, dict[str, list[str]]] = {}
    for name, *folders in streams:
        wheels = sorted({p for f in folders for p in Path(f).glob("*.whl")}, key=lambda p: p.name)
        own = [w for w in wheels if w.name not in seen]
        manifest[name] = {"wheels": [w.name for w in own], "shared": [w.name for w in wheels if w.name in seen]}
        for w in own:
            seen[w.name] = name
        with tempfile.TemporaryDirectory(dir=out) as tmp:
            d = Path(tmp) / name
            d.mkdir()
            for w in own:
                store(w, d / w.name)
            target = out / f"{name}.tar.zst"
            with open(target, "wb") as fo:
                tar = subprocess.Popen(["tar", "cf", "-", "-C", tmp, name], stdout=subprocess.PIPE)
                subprocess.run(["zstd", "-9", "-T2", "--long=27", "-q", "-c"], stdin=tar.stdout, stdout=fo, check=True)
                if tar.wait() != 0:
                    sys.exit(f"tar failed for stream {name}")
        print(f"{name}: {len(own)} wheels ({len(manifest[name]['shared'])} shared), "
              f"{sum(w.stat().st_size for w in own) / 2**20:.0f} MiB as wheels -> {target.stat().st_size / 2**20:.0f} MiB")
    (out / "MANIFEST.json").write_text(json.dumps(manifest, indent=1) + "\n")


def split(out: Path, part_mib: float, first_mib: float | None = None, order: list[str] | None = None) -> None:
    """Parts NAME00, NAME01, ... of `part_mib` MiB; the very first part (of the first stream in
    `order`) only `first_mib` (that call also carries the boot wheel)."""
    parts = out / "parts"
    shutil.rmtree(parts, ignore_errors=True)
    parts.mkdir()
    sums = []
    names = order or sorted(z.name.split(".")[0] for z in out.glob("*.tar.zst"))
    for i, name in enumerate(names):
        data = (out / f"{name}.tar.zst").read_bytes()
        sizes = [int((first_mib if (i == 0 and first_mib) else part_mib) * 2**20)]
        pos, n = 0, 0
        while pos < len(data):
            size = sizes[0] if n == 0 else int(part_mib * 2**20)
            (parts / f"{name}{n:02d}").write_bytes(data[pos:pos + size])
            pos, n = pos + size, n + 1
        sums.append(f"{hashlib.sha256(data).hexdigest()}  {name}")
    (parts / "SHA256").write_text("\n".join(sums) + "\n")
    shutil.copy(out / "MANIFEST.json", parts / "MANIFEST.json")
    for p in sorted(parts.iterdir()):
        print(f"{p.name} {p.stat().st_size / 2**20:.1f} MiB")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--stream", nargs="+", action="append", metavar=("NAME", "FOLDER"), default=[],
                    help="a stream's name and the folders of its wheels (repeatable, in install order)")
    ap.add_argument("--split", type=float, metavar="PART_MIB", help="split the packed streams into parts")
    ap.add_argument("--first-mib", type=float, help="size of the first part (its call carries more)")
    ap.add_argument("--order", help="streams in the order they travel, e.g. v,s (the first gets --first-mib)")
    a = ap.parse_args()
    if a.stream:
        pack(a.out, a.stream)
    if a.split:
        split(a.out, a.split, a.first_mib, a.order.split(",") if a.order else None)


if __name__ == "__main__":
    main()
