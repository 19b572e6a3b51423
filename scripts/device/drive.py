"""Drive a GPU study on the device machine: start each configuration's engine with
`servelab serve`, measure it with `servelab run --config` (the stage notebooks under papermill,
attached to that engine), run `vllm bench serve` on the same server where asked, stop the
engine, next. With two GPUs, two lanes run side by side (one engine per GPU), then the TP=2
configuration uses both. Progress goes to runs/<study>/device-progress.log; a configuration
whose run.json says complete is skipped, so a later call continues where time ran out.

Usage (on the device, from the repository root, PYTHONPATH holding the wheels and lib/):
  python3 scripts/device/drive.py params/h200-llama8b-vllm.yaml --deadline-s 520 [--gpus 2]
  python3 scripts/device/drive.py params/h200-llama8b-vllm.yaml --gpus 2 --only tp2,tp2-saturation
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "lib"))

from servelab.config import load_study  # noqa: E402

# (lane configs on one GPU each); configurations listed later run on all GPUs
LANES_2GPU = [["eager", "mnbt-2048", "mnbt-8192"], ["cudagraph", "cudagraph-saturation", "mnbt-4096", "mnbt-16384"]]
ALL_GPU = ["tp2", "tp2-saturation"]
PEER_RUNS = {  # vllm bench serve on the same server as these configurations: (input, output, concurrency)
    "cudagraph": [(256, 256, 1), (2048, 256, 4), (8192, 256, 4)],
    "tp2": [(256, 256, 1), (2048, 256, 4), (8192, 256, 4)],
}


def log(study: str, msg: str) -> None:
    line = f"{time.strftime('%H:%M:%S')} {msg}"
    print(line, flush=True)
    p = ROOT / "runs" / study / "device-progress.log"
    p.parent.mkdir(parents=True, exist_ok=True)
    with open(p, "a") as f:
        f.write(line + "\n")


def sh(args: list[str], timeout: float, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def complete(study: str, cid: str) -> bool:
    p = ROOT / "runs" / study / cid / "run.json"
    return p.exists() and json.loads(p.read_text()).get("status") == "complete"


def peer_bench(params: Path, study, cid: str, port: int, model_dir: str, deadline: float) -> None:
    out = ROOT / "runs" / study.study / "peer" / cid
    out.mkdir(parents=True, exist_ok=True)
    for inp, outp, c in PEER_RUNS.get(cid, []):
        name = f"vllm-bench-in{inp}-out{outp}-c{c}.json"
        if (out / name).exists() or time.monotonic() > deadline - 60:
            continue
        args = [sys.executable, "-m", "vllm.entrypoints.cli.main", "bench", "serve", "--backend", "openai-chat",
                "--endpoint", "/v1/chat/completions", "--base-url", f"http://127.0.0.1:{port}",
                "--model", model_dir, "--tokenizer", model_dir, "--dataset-name", "random",
                "--random-input-len", str(inp), "--random-output-len", str(outp), "--ignore-eos",
                "--max-concurrency", str(c), "--num-prompts", str(4 * c), "--seed", "42",
                "--save-result", "--save-detailed", "--result-dir", str(out), "--result-filename", name]
        r = sh(args, timeout=max(30, deadline - time.monotonic()))
        log(study.study, f"[{cid}] vllm bench serve in{inp} c={c}: exit {r.returncode} {r.stderr[-300:] if r.returncode else ''}")


def run_lane(params: Path, configs: list[str], gpus: str, port: int, deadline: float) -> None:
    study = load_study(params)
    served_args = None
    for cid in configs:
        if complete(study.study, cid):
            log(study.study, f"[{cid}] complete, skipped")
            continue
        if time.monotonic() > deadline - 120:
            log(study.study, f"[{cid}] not started: deadline")
            break
        eng = study.engine_for(cid).model_dump()
        if served_args != eng:
            if served_args is not None:
                sh([sys.executable, "-m", "servelab.cli", "serve", str(params), "--config", prev, "--stop"], 60)
            t0 = time.monotonic()
            r = sh([sys.executable, "-m", "servelab.cli", "serve", str(params), "--config", cid, "--port", str(port),
                    "--env", f"CUDA_VISIBLE_DEVICES={gpus}"], timeout=max(60, deadline - time.monotonic()))
            log(study.study, f"[{cid}] serve on GPU {gpus} port {port}: exit {r.returncode} in "
                             f"{time.monotonic() - t0:.0f} s {r.stdout.strip()[-200:]} {r.stderr.strip()[-600:]}")
            if r.returncode != 0:
                served_args = None
                continue
            served_args, prev = eng, cid
        else:
            # same engine as the previous configuration: measure on the running server, and
            # record it under this configuration's name too
            src = ROOT / "runs" / study.study / ".served" / f"{prev}.json"
            dst = ROOT / "runs" / study.study / ".served" / f"{cid}.json"
            dst.write_text(src.read_text())
        t0 = time.monotonic()
        r = sh([sys.executable, "-m", "servelab.cli", "run", str(params), "--config", cid, "--url",
                f"http://127.0.0.1:{port}", "--no-report", "--force"], timeout=max(60, deadline - time.monotonic()))
        log(study.study, f"[{cid}] run: exit {r.returncode} in {time.monotonic() - t0:.0f} s {r.stderr.strip()[-400:]}")
        if cid in PEER_RUNS:
            served = json.loads((ROOT / "runs" / study.study / ".served" / f"{cid}.json").read_text())
            peer_bench(params, study, cid, port, served["model_dir"], deadline)
    if served_args is not None:
        sh([sys.executable, "-m", "servelab.cli", "serve", str(params), "--config", prev, "--stop"], 60)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("params", type=Path)
    ap.add_argument("--deadline-s", type=float, default=520, help="stop starting work after this many seconds")
    ap.add_argument("--gpus", type=int, default=1)
    ap.add_argument("--only", help="comma-separated configurations to run (in this order, on all GPUs)")
    a = ap.parse_args()
    deadline = time.monotonic() + a.deadline_s
    study = load_study(a.params)
    log(study.study, f"drive start: {a.gpus} GPU(s), deadline {a.deadline_s:.0f} s")
    if a.only:
        run_lane(a.params, a.only.split(","), ",".join(str(i) for i in range(a.gpus)), 8000, deadline)
    elif a.gpus >= 2:
        threads = [threading.Thread(target=run_lane, args=(a.params, lane, str(i), 8000 + i, deadline))
                   for i, lane in enumerate(LANES_2GPU)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        run_lane(a.params, ALL_GPU, ",".join(str(i) for i in range(a.gpus)), 8000, deadline)
    else:
        run_lane(a.params, [c for lane in LANES_2GPU for c in lane], "0", 8000, deadline)
    log(study.study, "drive end")


if __name__ == "__main__":
    main()
