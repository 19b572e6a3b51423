"""`servelab compare A B`: two runs of a study (last month's and today's, one engine release and the
next) under the verdict machinery of `analysis.verdicts`, per level: faster / slower / no detectable
change with the 95 % interval and the minimum detectable effect, B against A.

A and B are run folders (records.jsonl) or study folders (a published `reports/<study>` with its
`data/`, or `runs/<study>`): two studies are compared configuration by configuration (the ids both
have). Each run folder is one engine start; every start beside it in its study (the study's A/A
repeats) joins the between-start estimate, so a comparison carries the variance between engine
starts that its own two starts cannot measure alone. A and B in two different studies (two runs of
one study, on two days or from two fresh clones) also carry the variance between runs
(`results.across`): measured from every setting both runs have, or given (`--between-run-sd-pct`). A setting is the engine's settings together
with the packages (run.json `packages`) and the model revision: A and B of one setting are an A/A
pair (the family-wise 5 % over its levels, as in a study). What differs is listed first: packages,
engine settings, engine version, model, workload; then the quality check's answers (`quality.json`,
`analysis.quality.compare`) when both have one. Not for rendering (`results.pages`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from ..analysis import quality as aq
from ..analysis import verdicts
from ..analysis.compare import DEFAULT_DIFF_IGNORE, config_diff, flatten
from ..errors import UserError
from ..runfolder import QUALITY_JSON, RECORDS, RunFolder, read_json
from ..summary import round_throughput
from . import across


@dataclass
class Context:
    """A run folder and the other starts of its study (the folder it sits in)."""

    label: str
    root: Path  # the folder the run folders sit in
    runs: dict[str, RunFolder]  # config id -> run folder, the study's starts


@dataclass
class Pair:
    config_a: str
    config_b: str
    differences: list[tuple[str, Any, Any]]
    verdicts: pd.DataFrame
    quality: dict[str, Any] | None
    between: dict[str, dict[str, Any]]
    aa: bool
    between_runs: dict[str, dict[str, Any]] = field(default_factory=dict)  # across two runs: the run term


@dataclass
class CompareResult:
    a: str
    b: str
    pairs: list[Pair] = field(default_factory=list)

    def lines(self) -> list[str]:
        """The terminal's view: what differs, then each level's verdict on aggregate tok/s."""
        out = []
        for p in self.pairs:
            head = f"{self.a}:{p.config_a} -> {self.b}:{p.config_b}" + (" (A/A: one setting)" if p.aa else "")
            out.append(head)
            for what, x, y in p.differences or [("nothing differs", "", "")]:
                out.append(f"  differs: {what}: {fmt(x)} -> {fmt(y)}" if x != "" else f"  {what}")
            rt = p.between_runs.get(verdicts.PRIMARY)
            if rt:
                out.append(f"  {run_term_text(rt)}")
            rows = p.verdicts[p.verdicts["metric"] == verdicts.PRIMARY] if len(p.verdicts) else p.verdicts
            if not len(rows):
                out.append("  no level measured by both")
            for r in rows.itertuples():
                out.append(f"  {r.level}: {r.verdict}, aggregate tok/s {signed(r.effect)} "
                           f"(95 % {signed(r.ci[0])} .. {signed(r.ci[1])}, MDE ±{pct(r.mde)})")
            if p.quality is not None:
                q = p.quality
                out.append(f"  quality: {q['identical']}/{q['total']} answers identical, score "
                           f"{q['baseline_score'][0]}/{q['baseline_score'][1]} -> {q['score'][0]}/{q['score'][1]}")
        flagged, total = self.aa_flagged()
        if total:
            out.append(f"A/A (one setting on both sides): {flagged} of {total} levels faster or slower")
        return out

    def aa_flagged(self) -> tuple[int, int]:
        """(levels of identical-setting pairs called faster or slower, levels of such pairs) on the primary
        metric: each is a false alarm."""
        rows = [r for p in self.pairs if p.aa and len(p.verdicts)
                for r in p.verdicts[p.verdicts["metric"] == verdicts.PRIMARY].itertuples()]
        return sum(r.verdict in (verdicts.FASTER, verdicts.SLOWER) for r in rows), len(rows)


def run_term_text(t: dict[str, Any]) -> str:
    """The variance between runs in words."""
    if t.get("source") == "runs":
        return (f"variance between runs (aggregate tok/s): sd {t['sd_pct']:.1f} % from {t['pairs']} level "
                f"differences of the {len(t['settings'])} settings both runs measured")
    if t.get("source") == "given":
        return f"variance between runs (aggregate tok/s): sd {t['sd_pct']:.1f} %, given (--between-run-sd-pct)"
    return ("variance between runs: not measured (no setting in both runs, none given with --between-run-sd-pct): "
            "the intervals carry the variance between starts and rounds only")


def fmt(x: Any) -> str:
    return "–" if x is None else str(x)


def pct(x: Any) -> str:
    return "–" if x is None or not math.isfinite(x) else f"{x * 100:.1f} %"


def signed(x: Any) -> str:
    return "–" if x is None or not math.isfinite(x) else f"{x * 100:+.1f} %"


def _runs_in(d: Path) -> dict[str, RunFolder]:
    return {p.name: RunFolder(p) for p in sorted(d.iterdir()) if p.is_dir() and (p / RECORDS).exists()}


def load(path: str | Path) -> tuple[Context, list[str]]:
    """(the context of `path`, the config ids it names): a run folder names itself, a study all its
    configurations."""
    p = Path(path)
    if not p.is_dir():
        raise UserError(f"{p}: no such run or study folder")
    if (p / RECORDS).exists():
        return Context(_label(p.parent), p.parent.resolve(), _runs_in(p.parent)), [p.name]
    for d in (p / "data", p):
        runs = _runs_in(d) if d.is_dir() else {}
        if runs:
            return Context(p.name, d.resolve(), runs), list(runs)
    raise UserError(f"{p}: neither a run folder (records.jsonl) nor a study folder (data/<config>/records.jsonl)")


def _label(parent: Path) -> str:
    return parent.parent.name if parent.name == "data" else parent.name


def setting(rf: RunFolder) -> dict[str, Any]:
    """What makes two starts one setting: the engine's settings, the packages, the model revision,
    the importing tool (an imported run has no engine settings of its own)."""
    run = rf.run
    engine = {k: x for k, x in (run.get("engine_params") or {}).items() if k not in DEFAULT_DIFF_IGNORE}
    return {"engine": engine, "packages": run.get("packages") or {},
            "model": (run.get("model") or {}).get("revision"),
            "imported": (run.get("imported") or {}).get("tool")}


def differences(a: RunFolder, b: RunFolder) -> list[tuple[str, Any, Any]]:
    """What differs between two runs, packages and engine settings first."""
    ra, rb = a.run, b.run
    out: list[tuple[str, Any, Any]] = []
    pa, pb = ra.get("packages") or {}, rb.get("packages") or {}
    for k in sorted(set(pa) | set(pb)):
        if pa.get(k) != pb.get(k):
            out.append((f"package {k}", pa.get(k), pb.get(k)))
    for path, x, y in config_diff(ra.get("engine_params") or {}, rb.get("engine_params") or {}):
        out.append((f"engine {path}", x, y))
    sa, sb = ra.get("server") or {}, rb.get("server") or {}
    if sa.get("version") != sb.get("version"):
        out.append(("engine version", sa.get("version"), sb.get("version")))
    ma, mb = (ra.get("model") or {}).get("revision"), (rb.get("model") or {}).get("revision")
    if ma != mb:
        out.append(("model revision", ma, mb))
    ia, ib = (ra.get("imported") or {}).get("tool"), (rb.get("imported") or {}).get("tool")
    if ia != ib:
        out.append(("measured by", ia or "servelab", ib or "servelab"))
    if ia or ib:  # an imported run has the tool's workload, not servelab's: the levels are what compares
        la, lb = sorted({r["label"] for r in a.levels}), sorted({r["label"] for r in b.levels})
        if la != lb:
            out.append(("levels", ", ".join(la), ", ".join(lb)))
    else:
        wa, wb = flatten(ra.get("workload") or {}), flatten(rb.get("workload") or {})
        for k in sorted(set(wa) | set(wb)):
            if wa.get(k) != wb.get(k):
                out.append((f"workload {k}", wa.get(k), wb.get(k)))
    sva, svb = (ra.get("servelab") or {}).get("commit"), (rb.get("servelab") or {}).get("commit")
    if sva and svb and sva != svb:
        out.append(("servelab commit", sva[:10], svb[:10]))
    return out


def _quality(a: RunFolder, b: RunFolder) -> dict[str, Any] | None:
    if not (a.exists(QUALITY_JSON) and b.exists(QUALITY_JSON)):
        return None
    return aq.compare(read_json(b / QUALITY_JSON), read_json(a / QUALITY_JSON))


def _starts(ctxs: list[Context]) -> tuple[pd.DataFrame, dict[str, dict[str, Any]]]:
    """Every start of the contexts: their round table (config = '<context>:<config>') and settings."""
    frames, settings = [], {}
    for c in ctxs:
        for cid, rf in c.runs.items():
            name = f"{c.label}:{cid}"
            rt = round_throughput(rf.records) if len(rf.records) else pd.DataFrame()
            if len(rt):
                rt = rt.assign(config=name)
                frames.append(rt)
            settings[name] = setting(rf)
    return (pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()), settings


def compare_pair(ctx_a: Context, cfg_a: str, ctx_b: Context, cfg_b: str,
                 between_sd_pct: float | None = None, between_run_sd_pct: float | None = None) -> Pair:
    """B's configuration against A's, level by level (analysis.verdicts; across two runs
    results.across, which adds the variance between runs)."""
    if ctx_b.root == ctx_a.root:  # two runs of one study: one set of starts
        ctxs = [ctx_a]
    else:
        if ctx_b.label == ctx_a.label:  # two studies of one name (a re-run): keep their starts apart
            ctx_a, ctx_b = Context(f"A {ctx_a.label}", ctx_a.root, ctx_a.runs), Context(f"B {ctx_b.label}", ctx_b.root,
                                                                                        ctx_b.runs)
        ctxs = [ctx_a, ctx_b]
    rounds, settings = _starts(ctxs)
    groups = verdicts.setting_groups(settings)
    a, b = f"{ctx_a.label}:{cfg_a}", f"{ctx_b.label}:{cfg_b}"
    if a == b:
        raise UserError(f"{cfg_a}: A and B are the same run folder")
    aa = b in groups.get(a, (a,))
    cmp_ = verdicts.Comparison(b, a, (b,), (a,), aa)
    terms: dict[str, across.RunTerm] = {}
    if len(ctxs) == 1:
        rows, betweens = verdicts.verdict_rows(rounds, [cmp_], groups.values(), given_sd_pct=between_sd_pct)
    else:
        run_of = {s: c.label for c in ctxs for s in (f"{c.label}:{cid}" for cid in c.runs)}
        rows, betweens, terms = across.verdict_rows(rounds, [cmp_], list(dict.fromkeys(groups.values())), run_of,
                                                    given_sd_pct=between_sd_pct, given_run_sd_pct=between_run_sd_pct)
    ra, rb = ctx_a.runs[cfg_a], ctx_b.runs[cfg_b]
    return Pair(cfg_a, cfg_b, differences(ra, rb), rows, _quality(ra, rb),
                {m: {"source": x.source, "sd_pct": x.sd_pct, "df": x.df, "starts": [list(g) for g in x.starts]}
                 for m, x in betweens.items()}, aa, {m: across.term_json(t) for m, t in terms.items()})


def compare(path_a: str | Path, path_b: str | Path, *, between_sd_pct: float | None = None,
            between_run_sd_pct: float | None = None) -> CompareResult:
    """Two run folders, or two study folders configuration by configuration (the ids both have)."""
    ctx_a, ids_a = load(path_a)
    ctx_b, ids_b = load(path_b)
    if len(ids_a) == 1 and len(ids_b) == 1:
        pairs = [(ids_a[0], ids_b[0])]
    elif len(ids_a) > 1 and len(ids_b) > 1:
        pairs = [(c, c) for c in ids_a if c in ids_b]
        if not pairs:
            raise UserError(f"{path_a} and {path_b} have no configuration id in common ({ids_a} / {ids_b})")
    else:
        raise UserError("compare two run folders, or two study folders (configuration by configuration)")
    res = CompareResult(str(path_a), str(path_b))
    for ca, cb in pairs:
        res.pairs.append(compare_pair(ctx_a, ca, ctx_b, cb, between_sd_pct, between_run_sd_pct))
    return res


__all__ = ["CompareResult", "Context", "Pair", "compare", "compare_pair", "differences", "load", "run_term_text",
           "setting"]
