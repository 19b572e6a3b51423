"""A configuration's quality check against its baseline's (`quality.json` of both run folders):
how many answers are token-for-token identical, where each changed answer first diverges, and
the task score on the known-answer set. A speed-up that changes answers or drops the score is
what seed 002 warns about. Not for sending the prompts (`measure.quality`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def _first_divergence(a: list[int], b: list[int]) -> int:
    """Index of the first token where the two differ (the shorter length if one is a prefix)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def _tokens(p: Mapping[str, Any]) -> list[Any]:
    ids = p.get("output_token_ids")
    return list(ids) if ids is not None else list(p.get("output_text") or "")  # characters without ids


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
