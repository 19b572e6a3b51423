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
# # 3. Benchmark
#
# A streaming client sends the study's workload: for every bucket (input x output tokens)
# and every concurrency level, warmup rounds (excluded) then measured rounds. Each request's
# record is appended to `records.jsonl` as it ends; `/metrics` (and NVML on a GPU machine) is
# sampled in the background; `run.json` keeps the reproducibility record. When `servelab run`
# started several configurations' engines side by side (`configs`), they are measured together,
# one round at a time in alternating order, with more rounds where a verdict is still open until
# the study's time budget is spent. With the default `start = False` this notebook shows the plan
# and sends nothing.

# %% tags=["parameters"]
params_path = "params/local-cpu-kv.yaml"  # the study's params file
config_id = "roomy"  # which configuration to measure
run_dir = "runs/local-cpu-kv/roomy"  # this configuration's run folder
reduced = False  # use the study's reduced workload (CI)
resume = False  # continue an interrupted run from its first incomplete level
start = False  # send the load (servelab run sets it); False: show the plan only
configs = []  # the configurations measured together, interleaved (servelab run sets it); []: config_id alone
deadline_unix = 0.0  # when the study's time budget ends (time.time() seconds; 0: no budget)

# %%
from IPython.display import display
from servelab import stages, views
from servelab.paths import resolve
from servelab.plan import load_plan

plan = load_plan(params_path, config_id, reduced)  # engine, workload and host, resolved once
rdir = resolve(run_dir)
views.level_plan(plan)

# %% [markdown]
# ## Run the load levels

# %%
if start and configs:
    plans = [load_plan(params_path, c, reduced) for c in configs]
    rdirs = [rdir.parent / c for c in configs]
    checked, took = stages.quality_all(plans, rdirs)  # two engines at a time
    for cid, q in checked.items():
        print(f"{cid}: {views.quality_line(q)}")
    design = stages.benchmark_interleaved(plans, rdirs, deadline_unix=deadline_unix or None, quality_s=took)
    display(views.sampling_table(design))
elif start:
    result = stages.benchmark(plan, rdir, progress=False, resume=resume)
    print(f"status: {result.status}, records: {result.records}. {result.message}")
    display(views.summary_table(result.summary))
else:
    print("start = False: no request sent. Set start = True (or run `servelab run`) to measure.")
