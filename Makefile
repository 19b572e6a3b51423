# servelab: the two commands of the README are `make report` and `make test`.
# Both set everything up first (idempotent): a venv in .venv with the project, vLLM's CPU
# build and the dev tools; Debian's chromium and a CJK font for the report checks.
# On a machine with NVIDIA GPUs: `make setup GPU=1` (vLLM's CUDA build instead of its CPU build);
# without internet, from a wheelhouse made elsewhere (scripts/wheelhouse.py): WHEELHOUSE=DIR.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.servelab-setup$(if $(GPU),-gpu)
STUDY ?= params/local-cpu.yaml
# Python may write bytecode (.pyc) here even where the shell sets PYTHONDONTWRITEBYTECODE: without
# it every engine start compiles vLLM and torch from source again (scripts/setup.sh).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: setup report test test-fast lab clean-runs engine-sglang

setup: $(STAMP)

$(STAMP): pyproject.toml scripts/setup.sh
	bash scripts/setup.sh
	touch $(STAMP)

report: setup
	$(BIN)/servelab run $(STUDY) --force

test: setup
	bash scripts/test.sh

# JupyterLab at the repository root (root or not, no browser opened); the .py notebooks open as
# notebooks through jupytext, and their paths resolve from the repository root.
lab: setup
	$(BIN)/jupyter lab --allow-root --no-browser --ip=127.0.0.1 --ServerApp.root_dir=$(CURDIR) \
		--ServerApp.default_url=/lab/tree/notebooks

test-fast: setup
	$(BIN)/python -m pytest -m "not engine and not notebooks" -q

clean-runs:
	rm -rf runs

# SGLang pins other packages than vLLM: its own virtualenv, which a study's SGLang engines start from
# (engine.python, or SERVELAB_SGLANG_PYTHON as printed; docs/gpu.md).
engine-sglang:
	[ -x .engines/sglang/bin/python ] || $(PY) -m venv .engines/sglang
	.engines/sglang/bin/python -m pip install -q $(if $(WHEELHOUSE),--no-index --find-links $(WHEELHOUSE)) 'sglang==0.5.16'
	@echo "export SERVELAB_SGLANG_PYTHON=$(CURDIR)/.engines/sglang/bin/python"
