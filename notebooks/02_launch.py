# %% [markdown]
# # 2. Launch the engine
#
# The engine starts as a child process in its own process group, from the configuration's
# typed flags. We wait for `/health` with a deadline and record the exact command, the
# environment, `/version` and the start-up time. The engine keeps running after this notebook
# ends; `servelab run` stops it (whole process group) once the benchmark is done, also when
# the benchmark fails.

# %% tags=["parameters"]
params_path = "params/local-cpu.yaml"  # the study's params file
config_id = "roomy"  # which configuration to launch
run_dir = "runs/local-cpu/roomy"  # this configuration's run folder
reduced = False  # use the study's reduced workload (CI)
resume = False  # (benchmark only) continue an interrupted run

# %%
from pathlib import Path

from servelab import pipeline, stages

study = pipeline.load(params_path, reduced)
rdir = Path(run_dir)

# %% [markdown]
# ## Start and wait for health

# %%
handle = stages.launch(study, config_id, rdir)
stages.launch_table(handle)
