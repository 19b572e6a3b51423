"""A configuration's quality check against its baseline's (`quality.json` of both run folders):
how many answers are token-for-token identical, where each changed answer first diverges, and
the task score on the known-answer set. A speed-up that changes answers or drops the score is
not a plain win. Not for sending the prompts (`measure.quality`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..measure.quality import score_answer
from ..prompts import load_set


def _first_divergence(a: list[int], b: list[int]) -> int:
    """Index of the first token where the two differ (the shorter length if one is a prefix)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def _text(p: Mapping[str, Any]) -> str:
    t = p.get("output_text")
    return t if isinstance(t, str) else ""  # a record frame has NaN where a request kept no text


def _tokens(p: Mapping[str, Any]) -> list[Any]:
    ids = p.get("output_token_ids")
    return list(ids) if isinstance(ids, (list, tuple)) else list(_text(p))  # characters without ids


def _score(q: Mapping[str, Any]) -> list[int]:
    s = q.get("score") or {}
    return [int(s.get("correct", 0)), int(s.get("total", 0))]


def compare(run_q: Mapping[str, Any], baseline_q: Mapping[str, Any]) -> dict[str, Any]:
    """Compare two quality.json objects, prompt by prompt (matched on set and id).

    Returns {"measurable", "identical", "total", "identical_share", "first_divergence":
    [{"id", "set", "token_index"}] (changed answers only), "score": [correct, total],
    "baseline_score", "changed", "score_dropped"} (score_dropped: a lower share of known answers
    right; False when either side scored none). Not measurable (either side: dummy weights)
    gives zero counts, NaN share and changed/score_dropped False."""
    measurable = bool(run_q.get("measurable")) and bool(baseline_q.get("measurable"))
    out: dict[str, Any] = {"measurable": measurable, "identical": 0, "total": 0, "identical_share": float("nan"),
                           "first_divergence": [], "score": _score(run_q), "baseline_score": _score(baseline_q),
                           "changed": False, "score_dropped": False}
    if not measurable:
        return out
    base = {(p.get("set"), p["id"]): p for p in baseline_q.get("prompts") or []}
    for p in run_q.get("prompts") or []:
        b = base.get((p.get("set"), p["id"]))
        if b is None:
            continue
        out["total"] += 1
        ta, tb = _tokens(p), _tokens(b)
        if ta == tb:
            out["identical"] += 1
        else:
            out["first_divergence"].append({"id": p["id"], "set": p.get("set"),
                                            "token_index": _first_divergence(ta, tb)})
    if out["total"]:
        out["identical_share"] = out["identical"] / out["total"]
    out["changed"] = out["identical"] < out["total"]
    (c, t), (bc, bt) = out["score"], out["baseline_score"]
    out["score_dropped"] = bool(t and bt and c / t < bc / bt)  # shares: a run may score fewer tasks
    return out


# -- answers under load (canaries) ---------------------------------------------------------------------

NON_INFERIORITY_MARGIN = 0.10  # a score under load this much below one-at-a-time's is a drop


def wilson(k: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """The Wilson score interval of a share k / n (95 %); (NaN, NaN) for n = 0."""
    if n <= 0:
        return float("nan"), float("nan")
    p = k / n
    d = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / d
    half = z * ((p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5) / d
    return max(0.0, mid - half), min(1.0, mid + half)


def _same_prefix(load: Mapping[str, Any], alone: Mapping[str, Any]) -> tuple[bool, int]:
    """Whether a canary's answer is the one-at-a-time answer (or its beginning, when the canary was
    cut at its length cap), and the first token (or character, without ids) where they differ."""
    a, b = _tokens(load), _tokens(alone)
    cut = load.get("finish_reason") == "length"
    same = a == (b[:len(a)] if cut else b)
    return same, (-1 if same else _first_divergence(a, b))


def canaries(records: Any, alone_q: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """Per level (bucket, concurrency) of one configuration's canary records (`measure.sources.canary`):
    how many of their answers are the configuration's one-at-a-time answers (`alone_q`, its
    quality.json) with the Wilson 95 % interval, the first differing token, the graded score under
    load and one-at-a-time on the same prompts, and whether the score holds within
    `NON_INFERIORITY_MARGIN` ("holds": the interval's lower end is above one-at-a-time's share less
    the margin; "drops": its upper end is below it; else "undecided")."""
    if records is None or len(records) == 0 or "canary" not in records:
        return []
    c = records[records["canary"].fillna(False).astype(bool) & records["ok"].astype(bool)]
    alone = {p["id"]: p for p in (alone_q or {}).get("prompts") or [] if p.get("set") == "quality"}
    expected = {p.id: p.expected for p in load_set("quality").prompts}
    out = []
    for (bucket, conc), g in c.groupby(["bucket", "concurrency"], sort=False):
        n = same = right = right_alone = 0
        first: dict[str, Any] | None = None
        for r in g.to_dict("records"):
            pid, a = r.get("prompt_id"), alone.get(r.get("prompt_id"))
            if a is None or not (alone_q or {}).get("measurable"):
                continue
            n += 1
            ok, at = _same_prefix(r, a)
            same += ok
            if not ok and (first is None or at < first["token_index"]):
                first = {"id": pid, "token_index": at}
            if expected.get(pid):
                right += score_answer(_text(r), expected[pid])
                right_alone += score_answer(_text(a), expected[pid])
        if not n:
            continue
        lo, hi = wilson(same, n)
        slo, shi = wilson(right, n)
        base = right_alone / n
        holds = ("holds" if slo >= base - NON_INFERIORITY_MARGIN else
                 "drops" if shi < base - NON_INFERIORITY_MARGIN else "undecided")
        out.append({"bucket": bucket, "concurrency": int(conc), "canaries": n, "identical": same, "identical_ci": [lo, hi],
                    "first_divergence": first, "score": right, "score_ci": [slo, shi], "score_alone": right_alone,
                    "quality": holds})
    return out
