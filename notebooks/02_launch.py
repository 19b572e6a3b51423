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
# # 2. Launch the engine
#
# Starts the configuration's engine in its own process group (or checks the attached server),
# waits for `/health`, and records the exact command, version and start-up time in
# `engine.json`; then seed 000's smoke check (one chat reply, one tool call where a tool-call
# parser is set) and the quality check: the study's known-answer prompts at temperature 0, answered
# before any load (they also warm the engine up), compared later with the baseline's answers. With the default `start = False` this notebook only shows what it would
# start: `servelab run` (or you, with `start = True`) starts it.

# %% tags=["parameters"]
params_path = "params/local-cpu-kv.yaml"  # the study's params file
config_id = "roomy"  # which configuration to launch
run_dir = "runs/local-cpu-kv/roomy"  # this configuration's run folder
reduced = False  # use the study's reduced workload (CI)
resume = False  # (benchmark only) continue an interrupted run
start = False  # start the engine (servelab run sets it); False: show the command only
check_quality = True  # answer the quality set once it is up (False: the interleaved benchmark does, one engine at a time)

# %%
from IPython.display import display
from servelab import stages, views
from servelab.paths import resolve
from servelab.plan import load_plan

plan = load_plan(params_path, config_id, reduced)  # engine, workload and host, resolved once
rdir = resolve(run_dir)
print(views.launch_plan(plan))

# %%
if start:
    handle = stages.launch(plan, rdir)
    display(views.launch_table(handle))
    if check_quality:
        print(views.quality_line(stages.quality(plan, rdir)))  # the output check at temperature 0 (quality.json)
else:
    print("start = False: nothing started. Set start = True (or run `servelab run`) to launch it.")
