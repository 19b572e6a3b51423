"""The pages of `results`: the comparison of two runs (`compare_page`) and the tools side by side
(`tools_page`: one server measured by servelab and other tools, each tool's per-request data
recomputed by servelab's definitions beside its own figures). Each page is a notebook built in
memory (Markdown, `report.html` tables and figures, `report.plots` for the curves) and rendered by
`report.render.notebook_to_html` with the report template: one self-contained page, no script.

    python -m servelab.results.pages reports/local-cpu-tools    # re-render the tools page from its imports/
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import nbformat
import numpy as np
import pandas as pd

from ..analysis import verdicts
from ..analysis.harmonise import definitions, recompute_per_request
from ..paths import portable
from ..report import html
from ..report import plots
from ..report.render import notebook_to_html
from ..runfolder import RunFolder, read_json
from ..secrets import scrub
from ..summary import summarize
from .compare import CompareResult, fmt, pct, run_term_text, signed
from .formats import SCHEMAS
from .importer import HARMONISED

IMPORTS = "imports"  # a tools study's run folders, one per tool: reports/<study>/imports/<tool>/
TIMES = "times.json"  # beside them: each tool run's wall time and CPU seconds (benchmarks/tools_study.py)


def _md(text: str) -> Any:
    return nbformat.v4.new_markdown_cell(text)


def _out(obj: Any) -> Any:
    """A code cell whose only output is `obj`'s HTML (a table or figure of report.html)."""
    markup = obj.data if hasattr(obj, "data") else str(obj)
    cell = nbformat.v4.new_code_cell("")
    cell.outputs = [nbformat.v4.new_output("display_data", data={"text/html": markup})]
    return cell


def _render(cells: list[Any], out: Path, title: str) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = cells
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return notebook_to_html(nb, out, title=title, language="en", scrub=lambda t: portable(scrub(t)))


# -- compare ------------------------------------------------------------------------------------------

def compare_page(res: CompareResult, out: str | Path, title: str | None = None) -> Path:
    """The comparison as a page: per pair what differs, each level's verdict, the quality check."""
    title = title or f"{Path(res.b).name} against {Path(res.a).name}"
    cells = [_md(f"# {title}\n\n**A**: `{res.a}`  \n**B**: `{res.b}`\n\n"
                 "Each level of B against the same level of A under servelab's two-level model of a measurement "
                 "(engine start × rounds): **faster**, **slower** or **no detectable change**, with the change's "
                 "95 % interval and the minimum detectable effect (MDE: the change this comparison finds with "
                 "80 % power). A run folder is one engine start; the variance between starts comes from the "
                 "repeated starts (A/A) of the studies they belong to; A and B from two different studies (two "
                 "runs, two days) also carry the variance between runs, measured from every setting both runs "
                 "have. Two runs of one setting (the engine's settings, packages and model) are an A/A pair, judged "
                 "at a family-wise 5 % over their levels.")]
    for p in res.pairs:
        head = f"## {p.config_a} → {p.config_b}" + (" (A/A: one setting)" if p.aa else "")
        cells.append(_md(head))
        diff = pd.DataFrame([(w, fmt(a), fmt(b)) for w, a, b in p.differences], columns=["what differs", "A", "B"])
        if len(diff):
            cells.append(_out(html.table(diff, "What differs between the two runs (packages and engine settings first)")))
        else:
            cells.append(_md("Nothing differs between the two runs' packages, engine settings, model and workload."))
        cells.append(_md(_between_text(p.between) + (f" The {run_term_text(p.between_runs[verdicts.PRIMARY])}."
                                                       if p.between_runs.get(verdicts.PRIMARY) else "")))
        if len(p.verdicts):
            t = pd.DataFrame([{
                "level": r.level, "metric": _METRIC_NAMES.get(r.metric, r.metric), "change": signed(r.effect),
                "95 % interval": f"{signed(r.ci[0])} .. {signed(r.ci[1])}", "MDE": f"±{pct(r.mde)}",
                "verdict": r.verdict, "rounds A / B": f"{int(r.baseline_rounds)} / {int(r.rounds)}"}
                for r in p.verdicts.itertuples()])
            cells.append(_out(html.table(t, "B against A per level: the change, its 95 % interval, the MDE and the "
                                          "verdict (for TTFT lower is better)")))
        else:
            cells.append(_md("The two runs measured no level in common: nothing to compare."))
        if p.quality is not None:
            q = p.quality
            share = q["identical_share"]
            cells.append(_md(
                f"**Quality check**: {q['identical']} of {q['total']} greedy answers are token-for-token identical"
                + (f" ({share * 100:.0f} %)" if isinstance(share, float) and math.isfinite(share) else "")
                + f"; known answers right: {q['baseline_score'][0]}/{q['baseline_score'][1]} in A, "
                  f"{q['score'][0]}/{q['score'][1]} in B" + (" (fewer: the score dropped)." if q.get("score_dropped")
                                                             else ".")))
            if q.get("first_divergence"):
                fd = pd.DataFrame(q["first_divergence"]).rename(columns={"id": "prompt", "set": "set",
                                                                         "token_index": "first differing token"})
                cells.append(_out(html.table(fd, "Answers that changed, and the first token where they differ")))
        else:
            cells.append(_md("No quality check to compare (one of the runs has no quality.json)."))
    return _render(cells, Path(out), title)


_METRIC_NAMES = {"aggregate_output_tps": "aggregate output tok/s", "ttft_p50_s": "TTFT p50"}


def _between_text(between: Mapping[str, Mapping[str, Any]]) -> str:
    b = between.get(verdicts.PRIMARY) or {}
    if b.get("source") == "repeats":
        starts = "; ".join(" / ".join(g) for g in b.get("starts") or [])
        return (f"Variance between engine starts (aggregate tok/s): sd {b['sd_pct']:.1f} % with {b['df']:.0f} "
                f"degrees of freedom, from the repeated starts {starts}.")
    if b.get("source") == "given":
        return f"Variance between engine starts (aggregate tok/s): sd {b['sd_pct']:.1f} %, given (--between-sd-pct)."
    return ("No repeated start of one setting beside these runs: the intervals carry the variance between rounds "
            "only, not between engine starts (give `--between-sd-pct` when it was measured elsewhere on the host).")


# -- the tools side by side ------------------------------------------------------------------------

def _runs(study: Path) -> dict[str, RunFolder]:
    d = study / IMPORTS
    return {p.name: RunFolder(p) for p in sorted(d.iterdir()) if (p / "records.jsonl").exists()}


def _who(rf: RunFolder) -> str:
    imp = rf.run.get("imported") or {}
    if imp:
        return f"{imp.get('name')} {imp.get('version') or ''}".strip()
    return f"servelab {(rf.run.get('servelab') or {}).get('version', '')}".strip()


def side_by_side(runs: Mapping[str, RunFolder]) -> pd.DataFrame:
    """servelab's summary of every tool's records (per-request metrics by servelab's definitions)."""
    frames = []
    for tool, rf in runs.items():
        s = summarize(recompute_per_request(rf.records).assign(config=tool))
        frames.append(s)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def harmonised(runs: Mapping[str, RunFolder]) -> pd.DataFrame:
    """Every imported tool's harmonised.json rows, one frame."""
    rows = []
    for tool, rf in runs.items():
        if (rf.path / HARMONISED).exists():
            rows += read_json(rf.path / HARMONISED)["rows"]
    return pd.DataFrame(rows)


def condensed(h: pd.DataFrame) -> pd.DataFrame:
    """One row per (tool, figure, level): the tool's figure and servelab's recomputation as the mean
    over its runs, the largest difference of a run, and the reason where a run's exceeds the tolerance."""
    h = h[h["field"].notna()]
    out = []
    for (tool, field, conc), g in h.groupby(["tool", "field", "concurrency"], sort=False):
        d = g["diff_pct"].astype(float)
        worst = d.abs().idxmax() if d.notna().any() else None
        reasons = [r for r in g["reason"] if isinstance(r, str)]
        by_tool = g["servelab_tool_def"] if "servelab_tool_def" in g else g["servelab_tool_stat"]
        out.append({"tool": tool, "figure": g["label"].iloc[0], "c": int(conc), "runs": len(g),
                    "tool's figure": _mean(g["tool_value"]), "servelab": _mean(g["servelab"]),
                    "servelab, tool's definition": _mean(by_tool),
                    "largest difference %": float(d[worst]) if worst is not None else math.nan,
                    "same definition": "yes" if bool(g["same"].iloc[0]) else "no",
                    "why they differ": reasons[0] if reasons else ""})
    return pd.DataFrame(out)


def imported_table(runs: Mapping[str, RunFolder]) -> pd.DataFrame:
    """What each imported tool's files were, as run.json says: the tool and the version its files
    state, the format they were recognised by, the measurement window the tool drew and how many
    requests of it each file stores of those the tool counted (one row per tool and format)."""
    out = []
    for tool, rf in runs.items():
        imp = rf.run.get("imported") or {}
        if not imp:
            continue
        per = imp.get("runs") or []
        for schema in dict.fromkeys(r.get("schema") for r in per) or [imp.get("schema")]:
            rs = [r for r in per if r.get("schema") == schema]
            excl: dict[str, int] = {}
            for r in rs:
                for k, n in (r.get("excluded") or {}).items():
                    excl[k] = excl.get(k, 0) + n
            stored, counted = sum(r.get("measured") or 0 for r in rs), [r.get("counted") for r in rs]
            window = (rs[0].get("window_rule") if rs else "") + (
                "; outside it, kept and flagged: " + ", ".join(f"{n} {k}" for k, n in excl.items()) if excl
                else "; none outside it")
            sample = (f"{stored} of {sum(counted)} requests stored" if all(c is not None for c in counted) and counted
                      else f"{stored} requests (the file states no count)")
            if any(r.get("sampled") for r in rs):
                sample += " (a sampled report)"
            out.append({"tool": imp.get("name") or tool, "version": imp.get("version") or "not stated",
                        "format recognised": SCHEMAS.get(schema or "", schema or "–"),
                        "files (runs)": f"{len(imp.get('files') or [])} ({len(rs)})", "measurement window": window,
                        "sample": sample})
    return pd.DataFrame(out)


def cpu_table(t: pd.DataFrame) -> pd.DataFrame:
    """Per tool and concurrency: wall seconds of a run, client and engine CPU seconds per request."""
    others = t["others_cpu_s"] if "others_cpu_s" in t else pd.Series(math.nan, index=t.index)
    # (not `engine=`: that is a keyword of DataFrameGroupBy.agg, numba's, and would swallow the column)
    t = t.assign(client=t["client_cpu_s"] / t["requests"], server=t["engine_cpu_s"] / t["requests"],
                 others=others / t["requests"])
    g = t.groupby(["tool", "concurrency"], sort=False).agg(runs=("rep", "count"), wall=("wall_s", "median"),
                                                           client=("client", "median"), server=("server", "median"),
                                                           others=("others", "max"))
    return g.reset_index().rename(columns={"concurrency": "c", "wall": "wall s per run (tool start included)",
                                           "client": "client CPU s per request", "server": "engine CPU s per request",
                                           "others": "other processes' CPU s per request (largest run)"})


def _cpu_text(t: pd.DataFrame) -> str:
    per = (t["client_cpu_s"] / t["requests"]).groupby(t["tool"]).median().sort_values()
    return ("Each tool's client shares the machine's two cores with the engine. Its CPU time per request "
            "(median over its runs): " + ", ".join(f"{k} {x:.2f} s" for k, x in per.items()) + ". A client that "
            "keeps a core busy while it waits takes that core from the engine, and the server it measures is slower. "
            + (f"Processes that were neither the engine nor the tool used at most "
               f"{(t['others_cpu_s'] / t['requests']).max():.2f} s of CPU per request during a run (last column). "
               if "others_cpu_s" in t else "")
            + "None of this touches the comparison of each tool's figures with servelab's recomputation below, "
              "which reads one and the same set of requests.")


def _mean(s: pd.Series) -> float:
    x = pd.to_numeric(s, errors="coerce").dropna()
    return float(x.mean()) if len(x) else math.nan


def _ecdf(runs: Mapping[str, RunFolder], column: str, xlabel: str, colors: Mapping[str, str]) -> Any:
    levels = sorted({int(c) for rf in runs.values() for c in rf.records["concurrency"].unique()})
    fig, axes = plt.subplots(1, len(levels), figsize=(3.6 * len(levels) + 0.6, 3.6), squeeze=False)
    for j, c in enumerate(levels):
        ax = axes[0][j]
        for tool, rf in runs.items():
            r = recompute_per_request(rf.records)
            x = np.sort(pd.to_numeric(r.loc[r["ok"] & (r["concurrency"] == c) & ~r["warmup"], column],
                                      errors="coerce").dropna().to_numpy())
            if len(x):
                ax.step(x, np.arange(1, len(x) + 1) / len(x), where="post", color=colors[tool], label=tool, lw=1.3)
        ax.set_title(f"concurrency {c}", fontsize=9)
        ax.set_xlabel(xlabel, fontsize=8)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("share of requests")
    h, lab = axes[0][0].get_legend_handles_labels()
    fig.legend(h, lab, loc="lower center", ncol=min(len(lab), 4), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    return fig


def _diff_figure(cond: pd.DataFrame) -> Any:
    d = cond.dropna(subset=["largest difference %"])
    labels = [f"{t}: {f} (c={c})" for t, f, c in zip(d["tool"], d["figure"], d["c"])]
    fig, ax = plt.subplots(figsize=(7.5, 0.24 * len(d) + 1.4))
    y = np.arange(len(d))
    colors = ["#2ca02c" if s == "yes" else "#ff7f0e" for s in d["same definition"]]
    ax.barh(y, d["largest difference %"], color=colors)
    ax.axvline(2, color="black", lw=0.8, ls="--")
    ax.axvline(-2, color="black", lw=0.8, ls="--")
    ax.set_yticks(y, labels, fontsize=6.5)
    ax.invert_yaxis()
    ax.set_xscale("symlog", linthresh=2)
    ax.set_xlabel("tool's figure / servelab's recomputation - 1 (%, symmetric log; dashed: ±2 %)", fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


def tools_page(study: str | Path, out: str | Path | None = None, *, title: str | None = None) -> Path:
    """reports/<study>/index.html from its imports/<tool>/ run folders."""
    study = Path(study)
    runs = _runs(study)
    if not runs:
        raise FileNotFoundError(f"{study / IMPORTS}: no run folder to show")
    title = title or "One vLLM CPU server, four benchmark tools: their figures recomputed by servelab's definitions"
    colors = plots.config_colors(list(runs))
    plots.use_language("en")
    summ = side_by_side(runs)
    h = harmonised(runs)
    cond = condensed(h) if len(h) else pd.DataFrame()
    cells = _tools_intro(runs, cond, title)
    cells += _tools_summary(study, runs, summ, colors)
    if len(cond):
        cells += _tools_own_figures(cond)
    cells += _tools_definitions(runs)
    return _render(cells, Path(out) if out else study / "index.html", title)


def _tools_intro(runs: Mapping[str, RunFolder], cond: pd.DataFrame, title: str) -> list[Any]:
    """The page's title paragraph (the server, the tools, how many figures agree) and what was imported."""
    first = next(iter(runs.values())).run
    who = ", ".join(f"{t} ({_who(rf)})" for t, rf in runs.items())
    unexpl = cond[cond["why they differ"].str.startswith("unexplained")] if len(cond) else cond
    over = cond[cond["largest difference %"].abs() > 2] if len(cond) else cond
    cells = [_md(f"# {title}\n\n"
                 f"The same server ({(first.get('server') or {}).get('version') and 'vLLM ' + str(first['server']['version']) or 'vLLM'}"
                 f" on this machine's CPU, model `{Path(str(first.get('model_name') or '')).name}`) measured by {who}, "
                 "with one workload (chat, 128 prompt tokens, 64 output tokens, end of sequence ignored) at two "
                 "concurrencies, the tools taking turns. Every tool's result file was imported with "
                 "`servelab import`: its requests became servelab records, and every metric below is recomputed "
                 "from them with servelab's definitions. Each tool's own figures stand beside the recomputation; "
                 f"{len(cond) - len(over)} of {len(cond)} agree within 2 %, and each of the {len(over)} that do not "
                 "has its definitional reason in the table"
                 + (f" — except {len(unexpl)} flagged unexplained." if len(unexpl) else ".")),
             _md("## The tools side by side, by servelab's definitions")]
    imp = imported_table(runs)
    if len(imp):
        cells[1:1] = [_md("## What was imported\n\nEach tool's files as `servelab import` read them: the version "
                          "they state, the format they were recognised by, the tool's measurement window (requests "
                          "it left out are kept in the run folder, flagged, and left out of every figure here as "
                          "the tool left them out) and how many requests of that window the files store of those "
                          "the tool counted."),
                      _out(html.table(imp, "The imported files: tool, version, format, window and sample size"))]
    return cells


def _tools_summary(study: Path, runs: Mapping[str, RunFolder], summ: pd.DataFrame,
                   colors: Mapping[str, str]) -> list[Any]:
    """Each tool's requests summarised by servelab, the CPU table, and Figures 1 to 4."""
    cols = {"config": "tool", "concurrency": "c", "sent": "requests", "ttft_p50_s": "TTFT p50 (s)",
            "tpot_p50_s": "TPOT p50 (s)", "decode_tps_p50": "decode tok/s p50", "itl_p50_s": "ITL p50 (s)",
            "e2e_p50_s": "e2e p50 (s)", "aggregate_output_tps": "aggregate tok/s", "rounds": "runs"}
    t = summ[list(cols)].rename(columns=cols)
    cells: list[Any] = []
    cells.append(_out(html.table(t, "Each tool's requests summarised by servelab (median over requests; aggregate "
                                  "tok/s: median over the tool's runs)",
                               notes={html.MISSING: "GuideLLM keeps no chunk times: no pooled ITL"})))
    times = study / TIMES
    if times.exists():
        cells.append(_md(_cpu_text(pd.DataFrame(read_json(times)))))
        cells.append(_out(html.table(cpu_table(pd.DataFrame(read_json(times))),
                                   "CPU seconds per request of each tool's client (its process tree) and of the engine "
                                   "during the tool's runs, on this 2-core machine (median over repetitions)")))
    spread = (summ["aggregate_output_tps_max"] / summ["aggregate_output_tps_min"] - 1) * 100
    cells.append(_md(f"Between its runs (one per engine start) one tool's aggregate tok/s at one concurrency differed by "
                     f"{spread.min():.0f} % to {spread.max():.0f} % (Figure 1's bars). With so few runs a difference "
                     "between two tools' servers is a verdict for `servelab compare` (`compare-aiperf.html`: AIPerf "
                     "against servelab, with its interval), not a reading of the table; the CPU table shows where a "
                     "client's own appetite is. The tools' requests also differ beyond the workload's lengths (prompt "
                     "text or random token ids, a per-request seed, per-chunk usage statistics): a server's speed that "
                     "differs between two light clients is not explained here."))
    cells.append(_out(html.figure(plots.throughput_vs_concurrency(summ, colors=colors),
                                "Figure 1. Aggregate output tok/s per tool and concurrency (bars: the range over runs).")))
    cells.append(_out(html.figure(plots.latency_vs_concurrency(summ, colors=colors),
                                "Figure 2. TTFT p95 and per-request decode tok/s per tool, by servelab's definitions.")))
    cells.append(_out(html.figure(_ecdf(runs, "ttft_s", "TTFT (s)", colors),
                                "Figure 3. Every request's TTFT (first chunk carrying text), per tool.")))
    cells.append(_out(html.figure(_ecdf(runs, "decode_tps", "decode tok/s per request", colors),
                                "Figure 4. Every request's decode tok/s = (output tokens - 1) / (e2e - TTFT), per tool.")))
    return cells


def _tools_own_figures(cond: pd.DataFrame) -> list[Any]:
    """Each tool's own figures beside servelab's recomputation, and Figure 5."""
    cells: list[Any] = []
    cells.append(_md("## Each tool's own figures beside servelab's recomputation\n\n"
                     "*servelab* is the recomputation from the tool's own per-request data with servelab's "
                     "definition and statistic (linear percentiles); *servelab, tool's definition* "
                     "recomputes the same requests the tool's way (its percentile, its per-request values where "
                     "the records keep them, its weights and its duration window). A difference above 2 % needs "
                     "a reason: it is *definitional* only where the definition that differs is named and the "
                     "recomputation by the tool's definition agrees with the tool (*not checked* where the "
                     "records do not keep the tool's own values); otherwise *unexplained*, with the numbers."))
    cells.append(_out(html.table(cond, "Tool's figure and servelab's recomputation (mean over the tool's runs; "
                                     "largest difference of one run)",
                               formats={"largest difference %": "{:+.2f}"},
                               notes={html.MISSING: "not reported by the tool or not computable"})))
    cells.append(_out(html.figure(_diff_figure(cond), "Figure 5. Largest difference of each figure from "
                                "servelab's recomputation (green: same definition, orange: different).")))
    return cells


def _tools_definitions(runs: Mapping[str, RunFolder]) -> list[Any]:
    """What the tools' data cannot give, and each figure's definition: servelab's and the tool's."""
    cells: list[Any] = []
    nr = [(t, m, why) for t in runs for m, why in ((read_json(runs[t].path / HARMONISED).get("not_recomputable") or {})
                                                   if (runs[t].path / HARMONISED).exists() else {}).items()]
    if nr:
        cells.append(_out(html.table(pd.DataFrame(nr, columns=["tool", "metric", "why it cannot be recomputed"]),
                                   "What a tool's per-request data cannot give")))
    d = definitions()
    rows = [(t.name, f.label, f.metric, f.definition, "yes" if f.same else f"no: {f.differs}") for t in d.tools
            if t.tool in runs for f in t.figures]
    cells.append(_md("## The definitions\n\nservelab's: " + "; ".join(f"`{k}`: {x}" for k, x in d.servelab.items())
                     + ". The tools' (`lib/servelab/data/tool_definitions.yaml`):"))
    cells.append(_out(html.table(pd.DataFrame(rows, columns=["tool", "figure", "servelab metric", "the tool's definition",
                                                           "same as servelab's"]),
                               "How each tool defines the figures compared above")))
    return cells


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    for s in args:
        print(tools_page(s))
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["compare_page", "condensed", "harmonised", "imported_table", "side_by_side", "tools_page"]
