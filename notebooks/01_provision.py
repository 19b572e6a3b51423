# %% [markdown]
# # 1. Provision the host
#
# The engine needs somewhere to run. For the embedded default that is this machine: the only
# preparation is a model directory built offline (a Llama-shaped config, random weights
# loaded with `--load-format dummy`, and a byte-level BPE tokenizer trained on local text).
# For an attached server (`host.kind: attach`) nothing is provisioned; we only record its URL.

# %% tags=["parameters"]
params_path = "params/local-cpu.yaml"  # the study's params file
config_id = "roomy"  # which configuration of the study to prepare
run_dir = "runs/local-cpu/roomy"  # this configuration's run folder
reduced = False  # use the study's reduced workload (CI)
resume = False  # (benchmark only) continue an interrupted run

# %%
from pathlib import Path

from servelab import pipeline, stages

study = pipeline.load(params_path, reduced)
rdir = Path(run_dir)

# %% [markdown]
# ## Host and model
#
# The model directory is cached under `.cache/servelab/models/`, keyed by a hash of the preset
# and the tokenizer recipe, so every configuration and every rerun serves the same files.

# %%
host = stages.provision(study, config_id, rdir)
host

# %% [markdown]
# ## Model facts
#
# Architecture facts read back from the directory's `config.json`; the KV bytes per token
# feed the KV-capacity diagnosis later.

# %%
# NBVAL_CHECK_OUTPUT
stages.model_facts_table(host)
