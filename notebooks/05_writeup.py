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
study_dir = "reports/local-cpu-kv"  # published study folder (its data/ holds the raw runs)
language = ""  # en or ja: write the report in this language; empty: the study language

# %%
from IPython.display import Markdown, display

from servelab.report import load_study_data
from servelab.report import diagnosis as dg
from servelab.report import html
from servelab.report import accuracy, checks, gpu, levels, money, plots
from servelab.report import sections as sec
from servelab.report import workload as wk
from servelab.report import capacity as cap
from servelab.report import why
from servelab.report import verdicts as vr

sd = load_study_data(study_dir)
sd = sd.with_language(language) if language else sd
w = sd.w
plots.use_language(sd.language)
labels, colors = sd.labels(), sd.colors
Markdown(f"# {sd.study.title}\n\n{sd.study.description or ''}")

# %%
vr.lead_figure(sd)  # the picture first: each change's effect and the A/A pairs (none where nothing is compared)

# %%
Markdown(f"{sec.anchor('headline', w('section.headline'))}\n\n{sec.headline(sd)}")

# %%
Markdown(f"{sec.anchor('setup', w('section.setup'))}\n\n{sec.sessions_text(sd)}\n\n{sec.engine_not_started_text(sd)}")

# %%
sec.config_table(sd)

# %%
sec.fixed_settings(sd)

# %%
Markdown(f"{sec.anchor('method', w('section.method'))}\n\n{sec.method_text(sd)}")

# %%
sec.definitions_table(sd)

# %%
Markdown(f"{sec.anchor('results', w('section.results'))}\n\n{w('results.intro')}")

# %%
for cid in sd.config_ids:
    display(sec.results_table(sd, cid))

# %%
Markdown(f"{sec.anchor('progression', w('section.progression'))}\n\n{w('story.progression_text')}")

# %%
sec.progression_table(sd)

# %%
Markdown(sec.reference_text(sd))  # answers against the model's own, when the study made them

# %%
acc_text, acc_table = accuracy.accuracy_section(sd)  # answers under load (canaries), when the study sent them
if acc_table is not None:
    display(Markdown(f"{sec.anchor('accuracy', w('section.accuracy'), 3)}\n\n{acc_text}"))
    display(acc_table)

# %%
Markdown(f"{sec.anchor('verdicts', w('section.verdicts'), 3)}\n\n{sec.verdicts_text(sd)}")

# %%
sec.verdict_table(sd)

# %%
why_text, why_figures = why.why_section(sd)  # surprises, and the law and knee of a one-knob sweep
Markdown(f"{sec.anchor('why', w('section.why'), 3)}\n\n{why_text}")

# %%
for knob, points, knee in why_figures:  # a decode-time law (knee None), else the throughput sweep
    if knee is None:
        display(html.figure(plots.time_law(points, knob, lang=sd.language), w("figure.time_law")))
    else:
        display(html.figure(plots.effect_vs_knob(points, knob, knee, lang=sd.language), w("figure.effect_vs_knob")))

# %%
sets_text, sets_table = levels.prompt_set_table(sd)
if sets_table is not None:
    display(Markdown(f"{sec.anchor('prompt-sets', w('prompts.title'), 3)}\n\n{sets_text}"))
    display(sets_table)


# %%
tune_text, tune_table = cap.tune_section(sd)  # a `tune:` study: its search is the progression
if tune_table is not None:
    display(Markdown(f"{sec.anchor('tune', w('section.tune'), 3)}\n\n{tune_text}"))
    display(tune_table)

# %%
cap_text, cap_table = cap.capacity_section(sd)  # shown when the study searched its capacity
if cap_table is not None:
    display(Markdown(f"{sec.anchor('capacity', w('capacity.title'), 3)}\n\n{cap_text}"))
    display(cap_table)

# %%
Markdown(sec.anchor("figures", w("section.figures")))

# %%
html.figure(plots.ttft_vs_prompt_tokens(sd.summary, labels, dg.prefill_fits(sd), colors=colors, lang=sd.language),
          w("figure.ttft_vs_prompt_tokens"))

# %%
html.figure(plots.throughput_vs_concurrency(sd.summary, labels, dg.goodput_frame(sd), colors=colors, lang=sd.language),
          w("figure.throughput_vs_concurrency"))

# %%
html.figure(plots.latency_vs_concurrency(sd.summary, labels, sd.study.slo.ttft_p95_s, colors=colors, lang=sd.language),
          w("figure.latency_vs_concurrency"))

# %%
html.figure(plots.per_user_vs_per_gpu(sd.summary, {c: sec.engine_gpus(sd, c) for c in sd.config_ids}, labels,
                                    colors=colors, lang=sd.language), w("figure.per_user_vs_per_gpu"))

# %%
Markdown(f"{sec.anchor('diagnosis', w('section.diagnosis'))}\n\n{sec.anchor('prefill', w('section.prefill'), 3)}")

# %%
dg.prefill_table(sd)

# %%
Markdown(f"{sec.anchor('saturation', w('section.saturation'), 3)}\n\n{w('saturation.intro', parts=sec.slo_parts(sd))}")

# %%
dg.saturation_table(sd)

# %%
Markdown(sec.anchor("kv", w("section.kv"), 3))

# %%
for cid in sd.config_ids:
    text, table, samples = dg.kv_section(sd, cid)
    display(Markdown(text))
    display(table)
    if samples is not None:
        display(html.figure(plots.kv_vs_time(samples, colors[cid], lang=sd.language),
                          w("figure.kv_vs_time", label=labels.get(cid, cid))))

# %%
hw_table, roofline_table = dg.roofline_tables(sd)
Markdown(sec.anchor("roofline", w("section.roofline"), 3))

# %%
hw_table

# %%
roofline_table

# %%
spec_text, spec_table = dg.spec_section(sd)
Markdown(f"{sec.anchor('speculative', w('section.speculative'), 3)}\n\n{spec_text}")

# %%
spec_table

# %%
spec_levels_text, spec_levels_table = levels.spec_table(sd)
if spec_levels_table is not None:
    display(Markdown(spec_levels_text))
    display(spec_levels_table)


# %%
pred_text, pred_table, pred_evidence = cap.prediction_section(sd)
Markdown(f"{sec.anchor('prediction', w('capacity.predict_title'), 3)}\n\n{pred_text}")

# %%
pred_table

# %%
Markdown(f"{sec.anchor('symptoms', w('section.symptoms'), 3)}\n\n{dg.client_overhead_text(sd)}")

# %%
Markdown(pred_evidence)  # large prediction errors as evidence

# %%
Markdown("\n\n".join(dg.symptom_text(sd, cid) for cid in sd.config_ids))

# %%
wk_text, wk_items = wk.section(sd)
if wk_text:
    display(Markdown(wk_text))
    for item in wk_items:
        display(Markdown(item) if isinstance(item, str) else item)

# %%
gpu_text, gpu_tables = gpu.gpu_tables(sd)
if gpu_tables:
    display(Markdown(f"{sec.anchor('gpu', w('section.gpu'))}\n\n{gpu_text}"))
    for t in gpu_tables:
        display(t)
    engines_table = gpu.comparison_table(sd)  # None with one engine
    if engines_table is not None:
        display(engines_table)

# %%
cost_text, cost_table = money.cost_section(sd)
Markdown(f"{sec.anchor('cost', w('section.cost'))}\n\n{cost_text}")

# %%
cost_table

# %%
peer_text, peer_table = money.peer_section(sd)
Markdown(f"{sec.anchor('peer', w('section.peer'))}\n\n{peer_text}")

# %%
peer_table

# %%
timing_text, timing_table = levels.timing_table(sd)
Markdown(f"{sec.anchor('timing', w('timing.title'))}\n\n{timing_text}")

# %%
timing_table

# %%
for item in checks.sections(sd):
    display(item)

# %%
Markdown(sec.anchor("repro", w("section.repro")))

# %%
for item in sec.repro_cards(sd):
    display(item)
