"""Drive a GPU study on the device machine from its params' `device:` block: for each configuration
start its engine with `servelab serve` (in the engine's own site dir, `device.site[kind]`), save
the server's own answers (`/get_server_info`, `/tokenize`, `/metrics` before and after) under
runs/<study>/<config>/recorded/, measure it with `servelab run --config` (GPU telemetry is
sampled by the benchmark stage wherever nvidia-smi exists), run the peer tools of
`device.peers[config]` on the same server (`analysis.peers.peer_command`), stop the engine, next.
Configurations whose resolved engine is identical share one server. Lanes run side by side, one
GPU each; `device.all_gpus` configurations run after them on every GPU, and so does every configuration
whose parallel layout takes more than one GPU (`--tensor-parallel-size 2`, `--data-parallel-size 2`,
SGLang `--tp-size 2`...: `CUDA_VISIBLE_DEVICES=0,1`, from `schema.device_gpus`). With `device.groups`
instead, one GPU holds several servers: a group's servers start at once (`device.stagger_s`
apart; port = engine.port + 10 x group number + place in the group), the group is measured one
configuration at a time once every server answers (or failed), a server stops after its last
configuration, and the next group starts as soon as only quality checks (`device.checks`, greedy
outputs: timing-insensitive) are left. `device.capacity` runs
`servelab capacity` on a configuration's server after its workload. Progress goes to
runs/<study>/device-progress.log; a configuration whose run.json says complete is skipped, so a
later call continues where time ran out.

Usage (on the device, from a snapshot of the repository, PYTHONPATH = servelab's deps + lib/):
  PYTHONPATH=/root/site:/root/snap/lib python3 scripts/device/drive.py params/X.yaml --deadline-s 1200
  ... --only a,b        (these configurations, in this order, on all GPUs)
  ... --reduced         (the study's reduced workload: a quick check of the procedure)
  ... --groups 0,2      (these of device.groups only; a later call runs the rest)
servelab itself (client, stages, papermill) runs with the PYTHONPATH drive.py was started with;
only the engines and the peer tools get `device.site[kind]` instead (never two sites at once).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "lib"))

from servelab.analysis.peers import peer_command
from servelab.schema import device_gpus, device_lanes, load_study, resolve_profile

PEER_ENGINE = {"vllm-bench": "vllm", "sglang-bench": "sglang"}
SERVE_MIN_S = 240   # do not start a new engine with less time than this left
RUN_MIN_S = 75      # do not start a measurement with less time than this left
ALL = "all"         # run_lane's GPUs after the lanes: each configuration's own (schema.device_gpus)
_lock = threading.Lock()


def log(study: str, msg: str) -> None:
    line = f"{time.strftime('%H:%M:%S')} {msg}"
    with _lock:
        print(line, flush=True)
        p = ROOT / "runs" / study / "device-progress.log"
        p.parent.mkdir(parents=True, exist_ok=True)
        with open(p, "a") as f:
            f.write(line + "\n")


def sh(args: list[str], timeout: float, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=max(5.0, timeout),
                              env={**os.environ, **(env or {})}, check=False)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
        return subprocess.CompletedProcess(args, 124, out, err + f"\n[drive] timed out after {timeout:.0f} s")


def site_env(site: str | None) -> dict[str, str]:
    """The environment of a process that runs in one engine's site dir (only that site)."""
    if not site:
        return {}
    return {"PYTHONPATH": site, "PATH": f"{site}/bin:{os.environ.get('PATH', '/usr/bin:/bin')}"}


def complete(study: str, cid: str) -> bool:
    p = ROOT / "runs" / study / cid / "run.json"
    try:
        return p.exists() and json.loads(p.read_text()).get("status") == "complete"
    except ValueError:
        return False


def http(url: str, body: dict[str, Any] | None = None, timeout: float = 20.0) -> tuple[int, str]:
    req = urllib.request.Request(url, data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Content-Type": "application/json"} if body is not None else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")[:2000]
    except Exception as e:  # noqa: BLE001 - recorded, never fatal
        return 0, f"{type(e).__name__}: {e}"


def record_server(base: str, model_dir: str) -> dict[str, tuple[int, str]]:
    """The server's own answers before the run: name -> (HTTP status, body)."""
    prompt = "This is deterministic benchmark input text."
    return {
        "get_server_info.json": http(base + "/get_server_info"),
        "server_info.json": http(base + "/server_info"),
        "version.json": http(base + "/version"),
        "models.json": http(base + "/v1/models"),
        "tokenize-prompt.json": http(base + "/tokenize", {"model": model_dir, "prompt": prompt}),
        "tokenize-chat.json": http(base + "/tokenize", {"model": model_dir,
                                                        "messages": [{"role": "user", "content": prompt}]}),
        "metrics-before.txt": http(base + "/metrics"),
    }


def save_recorded(study: str, cid: str, rec: dict[str, tuple[int, str]]) -> None:
    d = ROOT / "runs" / study / cid / "recorded"
    d.mkdir(parents=True, exist_ok=True)
    sp = d / "status.json"
    status = json.loads(sp.read_text()) if sp.exists() else {}
    for name, (code, body) in rec.items():
        status[name] = code
        if code == 200:
            (d / name).write_text(body)
    sp.write_text(json.dumps(status, indent=1) + "\n")


def peers(study, cid: str, base: str, model_dir: str, deadline: float) -> None:
    out = ROOT / "runs" / study.study / "peer" / cid
    out.mkdir(parents=True, exist_ok=True)
    site = study.device.site
    for run in study.device.peers.get(cid, []):
        argv, result = peer_command(run, base, model_dir, out, python=sys.executable)
        if result.exists():
            continue
        if time.monotonic() > deadline - 45:
            log(study.study, f"[{cid}] peer {result.name}: skipped (deadline)")
            continue
        t0 = time.monotonic()
        r = sh(argv, timeout=min(240, deadline - time.monotonic()), env=site_env(site.get(PEER_ENGINE[run.tool])))
        (out / (result.stem + ".log")).write_text(r.stdout[-20000:] + "\n--- stderr\n" + r.stderr[-20000:])
        log(study.study, f"[{cid}] peer {run.tool} in{run.input_tokens} c={run.concurrency}: exit {r.returncode} "
                         f"in {time.monotonic() - t0:.0f} s{(' ' + r.stderr.strip()[-300:]) if r.returncode else ''}")


def stop(params: Path, cid: str) -> None:
    sh([sys.executable, "-m", "servelab.cli", "serve", str(params), "--config", cid, "--stop"], 90)


def run_lane(params: Path, configs: list[str], gpus: str, port: int, deadline: float, reduced: bool) -> None:
    study = load_study(params)
    sid = study.study
    base = f"http://127.0.0.1:{port}"
    served: tuple[str, Any] | None = None  # (config that started it, its resolved engine)
    for cid in configs:
        if complete(sid, cid):
            log(sid, f"[{cid}] complete, skipped")
            continue
        eng = resolve_profile(study, cid)
        key = eng.model_dump()
        if served is None or served[1] != key:
            if served is not None:
                stop(params, served[0])
                served = None
            if time.monotonic() > deadline - SERVE_MIN_S:
                log(sid, f"[{cid}] not started: deadline ({deadline - time.monotonic():.0f} s left)")
                continue
            visible = gpus if gpus != ALL else (device_gpus(study).get(cid)  # the layout's GPUs
                                                or ",".join(str(i) for i in range(study.device.gpus)))
            env = [f"CUDA_VISIBLE_DEVICES={visible}"]
            env += [f"{k}={v}" for k, v in site_env(study.device.site.get(eng.kind)).items()]
            t0 = time.monotonic()
            args = [sys.executable, "-m", "servelab.cli", "serve", str(params), "--config", cid, "--port", str(port)]
            for e in env:
                args += ["--env", e]
            r = sh(args, timeout=deadline - time.monotonic())
            log(sid, f"[{cid}] serve {eng.kind} on GPU {visible} port {port}: exit {r.returncode} in "
                     f"{time.monotonic() - t0:.0f} s {r.stdout.strip()[-200:]} {r.stderr.strip()[-900:]}")
            if r.returncode != 0:
                stop(params, cid)
                continue
            served = (cid, key)
        else:  # same engine as the previous configuration: measure on the running server
            src = ROOT / "runs" / sid / ".served" / f"{served[0]}.json"
            (ROOT / "runs" / sid / ".served" / f"{cid}.json").write_text(src.read_text())
        if time.monotonic() > deadline - RUN_MIN_S:
            log(sid, f"[{cid}] not measured: deadline")
            continue
        measure(params, study, cid, base, deadline, reduced)
    if served is not None:
        stop(params, served[0])


def start_server(params: Path, study, cid: str, port: int, gpus: str, deadline: float) -> bool:
    """`servelab serve` for one configuration (blocks until /health answers); logs its start-up time."""
    eng = resolve_profile(study, cid)
    site = study.device.site.get(eng.kind)
    if site and os.environ.get("SERVELAB_WAIT_SITES"):  # step.sh installs the sites while the hold goes on
        while not Path(site, ".servelab-installed").exists() and time.monotonic() < deadline - SERVE_MIN_S:
            time.sleep(5)
        if not Path(site, ".servelab-installed").exists():
            log(study.study, f"[{cid}] not started: {site} not installed in time")
            return False
    env = [f"CUDA_VISIBLE_DEVICES={gpus}"] + [f"{k}={v}" for k, v in site_env(site).items()]
    args = [sys.executable, "-m", "servelab.cli", "serve", str(params), "--config", cid, "--port", str(port)]
    for e in env:
        args += ["--env", e]
    t0 = time.monotonic()
    r = sh(args, timeout=deadline - time.monotonic())
    log(study.study, f"[{cid}] serve {eng.kind} port {port}: exit {r.returncode} in {time.monotonic() - t0:.0f} s "
                     f"{r.stdout.strip()[-200:]} {r.stderr.strip()[-900:] if r.returncode else ''}")
    if r.returncode != 0:
        stop(params, cid)
    return r.returncode == 0


def measure(params: Path, study, cid: str, base: str, deadline: float, reduced: bool) -> None:
    """Record the server's answers, run the configuration's workload, then its peer tools."""
    sid = study.study
    handle = json.loads((ROOT / "runs" / sid / ".served" / f"{cid}.json").read_text())
    rec = record_server(base, handle["model_dir"])
    t0 = time.monotonic()
    if cid in study.device.checks:  # real-weights checks instead of the workload
        cmd = [sys.executable, str(ROOT / "scripts" / "device" / "real_checks.py"), "--url", base,
               "--out", str(ROOT / "runs" / sid / cid), "--checks", ",".join(study.device.checks[cid]),
               "--prompts", os.environ.get("SERVELAB_PROMPTS", str(ROOT / "lib" / "servelab" / "data" / "prompts"))]
        if os.environ.get("SERVELAB_CHECKS_MAX_TOKENS"):  # a shorter check (local tests of this driver)
            cmd += ["--max-tokens", os.environ["SERVELAB_CHECKS_MAX_TOKENS"]]
    else:
        cmd = [sys.executable, "-m", "servelab.cli", "run", str(params), "--config", cid, "--url", base,
               "--no-report", "--force"] + (["--reduced"] if reduced else [])
    r = sh(cmd, timeout=deadline - time.monotonic())
    if cid in study.device.checks:
        (ROOT / "runs" / sid / cid / "checks.log").write_text(r.stdout[-20000:] + "\n--- stderr\n" + r.stderr[-20000:])
    rec["metrics-after.txt"] = http(base + "/metrics")
    save_recorded(sid, cid, rec)
    gm = ROOT / "runs" / sid / cid / "gpu_metrics.jsonl"
    nlines = len(gm.read_text().splitlines()) if gm.exists() else 0
    log(sid, f"[{cid}] run: exit {r.returncode} in {time.monotonic() - t0:.0f} s, gpu_metrics.jsonl "
             f"{nlines} samples {r.stderr.strip()[-600:] if r.returncode else ''}")
    if study.device.peers.get(cid):
        peers(study, cid, base, handle["model_dir"], deadline)
        save_recorded(sid, cid, {"metrics-after-peers.txt": http(base + "/metrics")})


class Group:
    """One GPU, several servers: a group's servers start together (in a thread, so the next group
    can start while the current one's last, timing-insensitive checks run), are measured one at a
    time and each stops after its last configuration."""

    def __init__(self, params: Path, group: list[str], deadline: float, index: int = 0) -> None:
        self.params, self.group, self.deadline = params, group, deadline
        self.study = study = load_study(params)
        self.todo = [c for c in group if not complete(study.study, c)]
        self.servers: dict[str, tuple[str, int]] = {}  # engine key -> (configuration that starts it, port)
        self.key_of: dict[str, str] = {}
        for cid in self.todo:
            key = json.dumps(resolve_profile(study, cid).model_dump(), sort_keys=True, default=str)
            self.key_of[cid] = key
            self.servers.setdefault(key, (cid, study.engine.port + 10 * index + group.index(cid)))
        self.ok: dict[str, bool] = {}
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        self.thread = threading.Thread(target=self._start)
        self.thread.start()

    def _start(self) -> None:
        from servelab.hosts.local import model_dir_for

        sid = self.study.study
        for c in sorted(set(self.group) - set(self.todo), key=self.group.index):
            log(sid, f"[{c}] complete, skipped")
        if time.monotonic() > self.deadline - SERVE_MIN_S:
            log(sid, f"group {self.group}: not started: deadline ({self.deadline - time.monotonic():.0f} s left)")
            return
        for cid, _ in self.servers.values():  # model directories first, one at a time (one cache folder)
            model_dir_for(resolve_profile(self.study, cid))
        threads = []
        for i, (cid, port) in enumerate(self.servers.values()):
            if i and self.study.device.stagger_s:
                time.sleep(self.study.device.stagger_s)

            def one(cid: str = cid, port: int = port) -> None:
                self.ok[cid] = start_server(self.params, self.study, cid, port, "0", self.deadline)

            threads.append(threading.Thread(target=one))
            threads[-1].start()
        for t in threads:
            t.join()
        log(sid, f"group {self.group}: servers up {sorted(c for c, v in self.ok.items() if v)}, failed "
                 f"{sorted(c for c, v in self.ok.items() if not v)}")

    def run(self, reduced: bool, next_group: "Group | None") -> None:
        if self.thread is None:
            self.start()
        assert self.thread is not None
        self.thread.join()
        sid, dev = self.study.study, self.study.device
        for n, cid in enumerate(self.todo):
            if (next_group is not None and next_group.thread is None
                    and all(dev.checks.get(c) == ["quality"] for c in self.todo[n:])):
                log(sid, f"group {next_group.group}: starting while {self.todo[n:]} run (quality checks only)")
                next_group.start()
            first, port = self.servers[self.key_of[cid]]
            if self.ok.get(first):
                if first != cid:
                    src = ROOT / "runs" / sid / ".served" / f"{first}.json"
                    (ROOT / "runs" / sid / ".served" / f"{cid}.json").write_text(src.read_text())
                if time.monotonic() > self.deadline - RUN_MIN_S:
                    log(sid, f"[{cid}] not measured: deadline")
                else:
                    measure(self.params, self.study, cid, f"http://127.0.0.1:{port}", self.deadline, reduced)
                    capacity(self.study, cid, f"http://127.0.0.1:{port}", self.deadline)
            if self.ok.get(first) and all(self.key_of[c] != self.key_of[cid] for c in self.todo[n + 1:]):
                stop(self.params, first)
                log(sid, f"[{first}] server stopped")


def capacity(study, cid: str, base: str, deadline: float) -> None:
    """`servelab capacity` on the configuration's server (device.capacity), run folder <cid>-capacity."""
    opts = study.device.capacity.get(cid)
    if not opts:
        return
    out = ROOT / "runs" / study.study / f"{cid}-capacity"
    left = deadline - time.monotonic() - 30
    if left < 60:
        log(study.study, f"[{cid}] capacity: skipped (deadline)")
        return
    opts = list(opts)
    if "--budget-s" in opts:  # the params' budget, or what the deadline leaves if that is less
        i = opts.index("--budget-s")
        opts[i + 1] = str(int(min(float(opts[i + 1]), left)))
    else:
        opts += ["--budget-s", str(int(left))]
    t0 = time.monotonic()
    r = sh([sys.executable, "-m", "servelab.cli", "capacity", base, *opts, "--out", str(out)], timeout=left + 60)
    out.mkdir(parents=True, exist_ok=True)
    (out / "capacity.log").write_text(r.stdout[-20000:] + "\n--- stderr\n" + r.stderr[-20000:])
    log(study.study, f"[{cid}] capacity: exit {r.returncode} in {time.monotonic() - t0:.0f} s {r.stdout.strip()[-300:]}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("params", type=Path)
    ap.add_argument("--deadline-s", type=float, default=520, help="stop starting work after this many seconds")
    ap.add_argument("--only", help="comma-separated configurations to run (in this order, on all GPUs)")
    ap.add_argument("--reduced", action="store_true", help="the study's reduced workload (procedure check)")
    ap.add_argument("--groups", help="comma-separated indexes of device.groups to run (default: all)")
    a = ap.parse_args()
    deadline = time.monotonic() + a.deadline_s
    study = load_study(a.params)
    dev = study.device
    if dev is None:
        sys.exit(f"{a.params}: no device: block")
    lanes, wide = device_lanes(study)
    log(study.study, f"drive start: {dev.gpus} GPU(s), lanes {lanes}, after them {wide}, groups {dev.groups}, "
                     f"deadline {a.deadline_s:.0f} s, sites {dev.site}")
    if dev.groups and not a.only:
        pick = [int(x) for x in a.groups.split(",")] if a.groups else range(len(dev.groups))
        groups = [Group(a.params, g, deadline, i) for i, g in enumerate(dev.groups) if i in pick]
        for i, g in enumerate(groups):
            g.run(a.reduced, groups[i + 1] if i + 1 < len(groups) else None)
    elif a.only:
        run_lane(a.params, a.only.split(","), ALL, study.engine.port, deadline, a.reduced)
    else:
        if len(lanes) > dev.gpus:
            log(study.study, f"only {dev.gpus} GPU(s): lanes {lanes[dev.gpus:]} not run")
            lanes = lanes[: dev.gpus]
        threads = [threading.Thread(target=run_lane, args=(a.params, lane, str(i), study.engine.port + i, deadline,
                                                           a.reduced))
                   for i, lane in enumerate(lanes)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if wide:
            run_lane(a.params, wide, ALL, study.engine.port, deadline, a.reduced)
    log(study.study, "drive end")


if __name__ == "__main__":
    main()
