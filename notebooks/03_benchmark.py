# %% [markdown]
# # 3. Benchmark
#
# A streaming client sends the study's workload: for every bucket (input x output tokens)
# and every concurrency level, warmup rounds (excluded) then measured rounds. Each request's
# record is appended to `records.jsonl` as it ends; `/metrics` is sampled in the background
# into `server_metrics.jsonl`; `run.json` keeps the reproducibility record.

# %% tags=["parameters"]
params_path = "params/local-cpu.yaml"  # the study's params file
config_id = "roomy"  # which configuration to measure
run_dir = "runs/local-cpu/roomy"  # this configuration's run folder
reduced = False  # use the study's reduced workload (CI)
resume = False  # continue an interrupted run from its first incomplete level

# %%
from pathlib import Path

from servelab import pipeline, stages

study = pipeline.load(params_path, reduced)
rdir = Path(run_dir)

# %% [markdown]
# ## Run the load levels

# %%
result = stages.benchmark(study, config_id, rdir, progress=False, resume=resume)
print(f"status: {result.status}, records: {result.records}. {result.message}")

# %% [markdown]
# ## Summary per level
#
# TTFT and per-request rates are medians over measured requests; aggregate tok/s is the
# median over rounds (with its range).

# %%
stages.summary_table(result.summary)
