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

# %% tags=["parameters"]
study_dir = "reports/local-cpu"  # published study folder (its data/ holds the raw runs)
language = ""  # en or ja: write the report in this language; empty: the study language

# %%
from IPython.display import Markdown, display

from servelab.report import load_study_data
from servelab.report import diagnosis as dg
from servelab.report import html as rh
from servelab.report import checks, gpu, money, plots
from servelab.report import sections as sec
from servelab.report import capacity as cap

sd = load_study_data(study_dir)
sd = sd.with_language(language) if language else sd
w = sd.w
plots.use_language(sd.language)
labels, colors = sd.labels(), sd.colors
Markdown(f"# {sd.study.title}\n\n{sd.study.description or ''}")

# %%
Markdown(f"{sec.anchor('headline', w('headline'))}\n\n{sec.headline(sd)}")

# %%
Markdown(f"{sec.anchor('setup', w('setup'))}\n\n{sec.devices_text(sd)}")

# %%
sec.config_table(sd)

# %%
sec.fixed_settings(sd)

# %%
Markdown(f"{sec.anchor('method', w('method'))}\n\n{sec.method_text(sd)}")

# %%
sec.definitions_table(sd)

# %%
Markdown(f"{sec.anchor('results', w('results'))}\n\n{w('results_text')}")

# %%
for cid in sd.config_ids:
    display(sec.results_table(sd, cid))

# %%
Markdown(f"{sec.anchor('progression', w('progression'))}\n\n{w('progression_text')}")

# %%
sec.progression_table(sd)

# %%
tune_text, tune_table = cap.tune_section(sd)  # a `tune:` study: its search is the progression
if tune_table is not None:
    display(Markdown(f"{sec.anchor('tune', w('tune.title'), 3)}\n\n{tune_text}"))
    display(tune_table)

# %%
cap_text, cap_table = cap.capacity_section(sd)  # shown when the study searched its capacity
if cap_table is not None:
    display(Markdown(f"{sec.anchor('capacity', w('capacity.title'), 3)}\n\n{cap_text}"))
    display(cap_table)

# %%
Markdown(sec.anchor("figures", w("figures")))

# %%
rh.figure(plots.ttft_vs_prompt_tokens(sd.summary, labels, dg.prefill_fits(sd), colors=colors, lang=sd.language),
          w("fig_ttft"))

# %%
rh.figure(plots.throughput_vs_concurrency(sd.summary, labels, dg.goodput_frame(sd), colors=colors, lang=sd.language),
          w("fig_sat"))

# %%
rh.figure(plots.latency_vs_concurrency(sd.summary, labels, sd.study.slo.ttft_p95_s, colors=colors, lang=sd.language),
          w("fig_lat"))

# %%
rh.figure(plots.per_user_vs_per_gpu(sd.summary, {c: sec.engine_gpus(sd, c) for c in sd.config_ids}, labels,
                                    colors=colors, lang=sd.language), w("fig_pareto"))

# %%
Markdown(f"{sec.anchor('diagnosis', w('diagnosis'))}\n\n{sec.anchor('prefill', w('prefill'), 3)}")

# %%
dg.prefill_table(sd)

# %%
Markdown(f"{sec.anchor('saturation', w('saturation'), 3)}\n\n{w('slo_text', parts=sec.slo_parts(sd))}")

# %%
dg.saturation_table(sd)

# %%
Markdown(sec.anchor("kv", w("kv"), 3))

# %%
for cid in sd.config_ids:
    text, table, samples = dg.kv_section(sd, cid)
    display(Markdown(text))
    display(table)
    if samples is not None:
        display(rh.figure(plots.kv_vs_time(samples, colors[cid], lang=sd.language),
                          w("fig_kv", label=labels.get(cid, cid))))

# %%
hw_table, roofline_table = dg.roofline_tables(sd)
Markdown(sec.anchor("roofline", w("roofline"), 3))

# %%
hw_table

# %%
roofline_table

# %%
spec_text, spec_table = dg.spec_section(sd)
Markdown(f"{sec.anchor('speculative', w('speculative'), 3)}\n\n{spec_text}")

# %%
spec_table

# %%
pred_text, pred_table, pred_evidence = cap.prediction_section(sd)
Markdown(f"{sec.anchor('prediction', w('capacity.predict_title'), 3)}\n\n{pred_text}")

# %%
pred_table

# %%
Markdown(f"{sec.anchor('symptoms', w('symptoms'), 3)}\n\n{dg.client_overhead_text(sd)}")

# %%
Markdown(pred_evidence)  # large prediction errors as evidence

# %%
Markdown("\n\n".join(dg.symptom_text(sd, cid) for cid in sd.config_ids))

# %%
gpu_text, gpu_tables = gpu.gpu_tables(sd)
if gpu_tables:
    display(Markdown(f"{sec.anchor('gpu', w('gpu'))}\n\n{gpu_text}"))
    for t in gpu_tables:
        display(t)
    display(gpu.comparison_table(sd))

# %%
cost_text, cost_table = money.cost_section(sd)
Markdown(f"{sec.anchor('cost', w('cost'))}\n\n{cost_text}")

# %%
cost_table

# %%
peer_text, peer_table = money.peer_section(sd)
Markdown(f"{sec.anchor('peer', w('peer'))}\n\n{peer_text}")

# %%
peer_table

# %%
for item in checks.sections(sd):
    display(item)

# %%
Markdown(sec.anchor("repro", w("repro")))

# %%
for item in sec.repro_cards(sd):
    display(item)
