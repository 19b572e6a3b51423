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

# %%
Markdown("## Diagnosis\n\n### TTFT vs prompt length\n\n"
         "A least-squares fit of TTFT = overhead + prompt tokens / prefill rate over the measured "
         "requests at concurrency 1.")

# %%
report.prefill_fit_table(sd)

# %%
Markdown(f"### Saturation and goodput\n\n{report.slo_text(sd)} The knee is the lowest concurrency after "
         "which each doubling adds less than 10% aggregate throughput.")

# %%
report.saturation_table(sd)

# %%
Markdown("### KV-cache residency\n\nKV usage, running and waiting requests and preemptions, sampled from the "
         "engine's `/metrics` during every level.")

# %%
for cid in sd.config_ids:
    text, table, fig = report.kv_section(sd, cid)
    display(Markdown(text))
    display(table)

# %%
hw_table, efficiency = report.roofline_table(sd)
Markdown("### Roofline\n\nDecode is memory-bound: a step reads every weight plus the KV cache, so time per token "
         "≥ bytes / bandwidth. Efficiency = bound / measured TPOT.")

# %%
hw_table

# %%
efficiency

# %%
spec_text, spec_table = report.spec_section(sd)
Markdown(f"### Speculative decoding\n\n{spec_text}")

# %%
spec_table

# %%
Markdown("### One change at a time\n\nEach configuration against its baseline (the configuration named in the "
         "params, else the nearest earlier one measured on the same levels); a change is attributed only "
         "when exactly one setting differs.")

# %%
report.one_change_table(sd)

# %%
Markdown(f"### Observation → first check (seed 002)\n\n{report.client_overhead_text(sd)}")

# %%
for cid in sd.config_ids:
    display(Markdown(f"**{cid}**"))
    display(report.symptom_table(sd, cid))

# %%
cost_text, cost_table = report.cost_section(sd)
Markdown(f"## Cost: self-host vs managed API\n\n{cost_text}")

# %%
cost_table

# %%
peer_text, peer_table = report.peer_section(sd)
Markdown(f"## Side by side with `vllm bench serve`\n\n{peer_text}")

# %%
peer_table
