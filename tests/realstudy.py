"""A small real-model study written to disk, shaped by the interface between the engine side and
the report side of issue 21 (/work/briefs/realmodel-interface.md, copied in spirit, not read):
records carry `prompt_set`/`prompt_id`, the level rows of a speculating configuration carry
`spec_*` counters, every configuration has a quality.json, run.json says `real_weights: true`.

The numbers are invented but fixed (no randomness), so tests can assert exact values: eager
decodes at 40 tok/s, compiled at 48 (+20 %), n-gram at 80 on `rewrite` and 44 on `code`; the
n-gram configuration changes one of four quality answers (token 7 of `q-list`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SETS = {"rewrite": 120, "code": 60}  # prompt set -> prompt tokens
DECODE_TPS = {"eager": {"rewrite": 40.0, "code": 40.0}, "compiled": {"rewrite": 48.0, "code": 48.0},
              "ngram": {"rewrite": 80.0, "code": 44.0}}
STARTUP_S = {"eager": 31.0, "compiled": 104.0, "ngram": 33.0}
ARGS = {"eager": {"enforce-eager": True}, "compiled": {},
        "ngram": {"enforce-eager": True, "speculative-config": {"method": "ngram", "num_speculative_tokens": 4,
                                                                "prompt_lookup_max": 4, "prompt_lookup_min": 2}}}
BASELINE = {"compiled": "eager", "ngram": "eager"}
ROUNDS, OUT_TOKENS, CONC = 3, 64, (1, 4)


def _records(cid: str) -> list[dict[str, Any]]:
    out, t, level = [], 1000.0, -1
    for pset, prompt in SETS.items():
        for conc in CONC:
            level += 1
            # at c=4 each request decodes at 80 % of its c=1 speed (four share two cores)
            tps = DECODE_TPS[cid][pset] * (1.0 if conc == 1 else 0.8)
            for rnd in range(ROUNDS):
                e2e = 0.05 + (OUT_TOKENS - 1) / tps
                for seq in range(conc):
                    out.append({"study": "real", "config": cid, "level": level, "bucket": pset,
                                "target_input_tokens": prompt, "target_output_tokens": OUT_TOKENS,
                                "shared_prefix": False, "concurrency": conc, "rate_rps": 0.0, "round": rnd,
                                "warmup": False, "seq": seq, "ok": True, "error_kind": None, "start_s": t,
                                "end_s": t + e2e + 0.001 * rnd, "ttft_s": 0.05, "e2e_s": e2e + 0.001 * rnd,
                                "prompt_tokens": prompt, "output_tokens": OUT_TOKENS,
                                "chunk_times_s": [0.05, 0.05 + 1 / tps], "finish_reason": "stop",
                                "decode_tps": tps, "e2e_output_tps": OUT_TOKENS / e2e, "tpot_s": 1 / tps,
                                "prompt_set": pset, "prompt_id": f"{pset}-{seq}"})
                t += e2e + 1.0
    return out


def _levels(cid: str) -> list[dict[str, Any]]:
    """levels.jsonl rows as the runner writes them: engine counter increments over the measured
    rounds (`counters`) and their duration (`measured_s`); 100 drafts of 4 tokens per level."""
    rows = []
    for level, pset in enumerate(p for p in SETS for _ in CONC):
        conc = CONC[level % len(CONC)]
        row = {"level": level, "label": f"{pset} c={conc}", "status": "complete", "sent": conc * ROUNDS, "failed": 0}
        if cid == "ngram":
            rate = 0.5 if pset == "rewrite" else 0.125
            row.update(measured_s=10.0 / conc,  # 400 draft tokens: 40 per second at c=1, 160 at c=4
                       counters={"spec_drafts_total": 100.0, "spec_draft_tokens_total": 400.0,
                                 "spec_accepted_tokens_total": 400.0 * rate,
                                 "spec_accepted_per_pos_total": [100 * rate * f for f in (1.5, 1.0, 1.0, 0.5)]})
        else:
            row.update(measured_s=10.0, counters={})
        rows.append(row)
    return rows


def _quality(cid: str) -> dict[str, Any]:
    prompts = []
    for pid, expected in (("q-capital", "Paris"), ("q-sum", "4"), ("q-list", None), ("q-code", None)):
        ids = list(range(10, 30))
        if cid == "ngram" and pid == "q-list":
            ids = ids[:7] + [99] + ids[8:]
        prompts.append({"id": pid, "set": "quality", "output_text": f"answer {pid}", "output_token_ids": ids,
                        "finish_reason": "stop", "expected": expected, "correct": True if expected else None})
    return {"format_version": 1, "measurable": True, "reason": None, "prompts": prompts,
            "score": {"correct": 2, "total": 2}, "elapsed_s": 12.5}


def write_study(root: Path) -> Path:
    """The study as a published report's data folder under `root`; returns `root`."""
    data = root / "data"
    configs = [{"id": c, "label": c, **({"baseline": BASELINE[c]} if c in BASELINE else {}),
                "engine": {"args": ARGS[c]}} for c in DECODE_TPS]
    study = {"study": "real", "title": "real-model fixture", "language": "en",
             "engine": {"kind": "vllm", "model": {"preset": "cpu-tiny"}, "args": {"dtype": "bfloat16"}},
             "workload": {"api": "chat", "buckets": [{"prompt_set": s, "output_tokens": OUT_TOKENS, "name": s} for s in SETS],
                          "concurrency": list(CONC), "rounds": ROUNDS, "warmup_rounds": 0},
             "configurations": configs}
    data.mkdir(parents=True, exist_ok=True)
    (data / "study.json").write_text(json.dumps({"params_path": "params/real.yaml", "reduced": False,
                                                  "study": study}))
    for c in configs:
        cid = c["id"]
        d = data / cid
        d.mkdir(exist_ok=True)
        (d / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _records(cid)))
        (d / "levels.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _levels(cid)))
        (d / "quality.json").write_text(json.dumps(_quality(cid)))
        run = {"study": "real", "config": cid, "status": "complete", "started_at": "2026-12-01T10:00:00+00:00",
               "finished_at": "2026-12-01T10:02:30+00:00" if cid != "compiled" else "2026-12-01T10:03:40+00:00",
               "engine_params": {"kind": "vllm", "args": {"dtype": "bfloat16", **ARGS[cid]}},
               "model": {"facts": {"real_weights": True, "architecture": "LlamaForCausalLM"}},
               "server": {"version": "0.32.0", "startup_s": STARTUP_S[cid]}}
        (d / "run.json").write_text(json.dumps(run))
        if cid == "compiled":  # vLLM's own line, as in reports/h200-llama8b-vllm/data/cudagraph/engine.log
            (d / "engine.log").write_text("(EngineCore pid=1) INFO [monitor.py:53] torch.compile took 61.50 s in total\n")
    return root
