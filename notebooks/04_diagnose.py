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
# # 4. Diagnose one configuration
#
# Reads only files of the run folder: how TTFT grows with the prompt, where throughput
# saturates, and what the engine's own counters said while it ran. The defaults explore the
# published default study's committed data, so this runs without a server.

# %% tags=["parameters"]
params_path = "params/local-cpu-kv.yaml"  # the study's params file
config_id = "roomy"  # which configuration to diagnose
run_dir = "reports/local-cpu-kv/data/roomy"  # this configuration's run folder (default: the published data)
reduced = False  # use the study's reduced workload (CI)
resume = False  # (benchmark only) continue an interrupted run
start = False  # (launch, benchmark only)

# %%
from servelab import views
from servelab.paths import resolve
from servelab.report import plots
from servelab.runfolder import RunFolder

run = RunFolder(resolve(run_dir))  # everything the run folder holds, read from files only

# %% [markdown]
# ## TTFT vs prompt length

# %%
fig = plots.ttft_vs_prompt_tokens(run.summary)

# %% [markdown]
# ## Throughput and latency vs concurrency

# %%
fig = plots.throughput_vs_concurrency(run.summary)

# %%
fig = plots.latency_vs_concurrency(run.summary)

# %% [markdown]
# ## Server-side view
#
# KV-cache usage, running and waiting requests, and preemptions from the engine's `/metrics`.

# %%
views.server_metrics_table(run)
