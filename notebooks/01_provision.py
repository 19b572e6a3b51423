# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
#   language_info:
#     name: python
# ---

# %% [markdown]
# # 1. Provision the host
#
# The engine needs somewhere to run. For the embedded default that is this machine: the only
# preparation is a model directory built offline (a Llama-shaped config, random weights
# loaded with `--load-format dummy`, and a byte-level BPE tokenizer trained on local text).
# For an attached server (`host.kind: attach`) nothing is provisioned; we only record its URL.
# Run top to bottom with the defaults, this builds (or reuses) the default study's model
# directory; paths are taken from the repository root wherever the kernel starts.

# %% tags=["parameters"]
params_path = "params/local-cpu-kv.yaml"  # the study's params file
config_id = "roomy"  # which configuration of the study to prepare
run_dir = "runs/local-cpu-kv/roomy"  # this configuration's run folder
reduced = False  # use the study's reduced workload (CI)
resume = False  # (benchmark only) continue an interrupted run
start = False  # (launch, benchmark) start the engine / send load; servelab run sets it

# %%
from servelab import stages, views
from servelab.paths import resolve
from servelab.plan import load_plan

plan = load_plan(params_path, config_id, reduced)  # engine, workload and host, resolved once
rdir = resolve(run_dir)

# %%
host = stages.provision(plan, rdir)
host

# %% [markdown]
# The model's architecture facts (what the roofline and the KV-cache checks use later):

# %%
views.model_facts_table(host)
