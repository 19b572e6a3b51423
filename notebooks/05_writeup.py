# %% tags=["parameters"]
study_dir = "reports/local-cpu"  # published study folder (its data/ holds the raw runs)

# %%
from IPython.display import Markdown

from servelab import plots, report

sd = report.load_study_data(study_dir)
plots.use_language(sd.language)
labels = sd.labels()
Markdown(f"# {sd.study['title']}\n\n{sd.study.get('description') or ''}")

# %%
Markdown(f"## {sd.t('headline')}\n\n{report.headline(sd)}")

# %%
Markdown(f"## {sd.t('configs')}")

# %%
# NBVAL_CHECK_OUTPUT
report.config_table(sd)

# %%
report.common_settings(sd)

# %%
Markdown(f"## {sd.t('method')}\n\n{report.method_text(sd)}\n\n### {sd.t('definitions')}")

# %%
report.definitions_table()

# %%
Markdown(f"## {sd.t('results')}")

# %%
for cid in sd.config_ids:
    display(Markdown(f"### {labels.get(cid, cid)} (`{cid}`)"))
    display(report.seed_table(sd, cid))

# %%
Markdown(f"## {sd.t('progression')}")

# %%
# NBVAL_CHECK_OUTPUT
report.progression(sd, "aggregate_output_tps")

# %%
report.progression(sd, "ttft_p50_s")

# %%
Markdown(f"## {sd.t('figures')}")

# %%
fig = plots.ttft_vs_prompt_tokens(sd.summary, labels)

# %%
fig = plots.throughput_vs_concurrency(sd.summary, labels)

# %%
fig = plots.latency_vs_concurrency(sd.summary, labels)

# %%
Markdown(f"## {sd.t('repro')}")

# %%
report.repro_table(sd)
