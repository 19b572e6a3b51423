"""The attach host: a server that already runs (an ALB, a managed API, or an engine that
`servelab serve` started detached for a GPU study). servelab checks that it answers, finds its
model name, reads its server facts through the engine profile, and never stops it (except an
engine it served itself: `stop_served`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import httpx

from ..engines import get as engine_profile
from ..runfolder import read_json, write_json
from ..schema import AttachParams, EngineParams, Study, resolve_profile
from .base import Host, Server, is_engine
from .local import model_dir_for, served_path
from .process import Engine, EngineError, stop_process_group


def attach(p: AttachParams, engine_kind: str = "vllm") -> Server:
    """Check that an already running server answers and find its model name.

    Raises EngineError (one line) when the URL cannot be reached or the key is missing.
    """
    headers = dict(p.headers)
    if p.api_key_env:
        key = os.environ.get(p.api_key_env)
        if not key:
            raise EngineError(f"environment variable {p.api_key_env} (host.attach.api_key_env) is not set")
        headers["Authorization"] = f"Bearer {key}"
    base = p.url.rstrip("/")
    if base.endswith("/v1"):
        base = base[: -len("/v1")]
    try:
        r = httpx.get(base + "/v1/models", headers=headers, timeout=10.0)
    except httpx.HTTPError as e:
        raise EngineError(f"cannot reach {base}/v1/models: {type(e).__name__}: {e}") from None
    if r.status_code != 200:
        raise EngineError(f"{base}/v1/models answered HTTP {r.status_code}: {r.text[:200]}")
    models = [m.get("id") for m in r.json().get("data", [])]
    model = p.model or (models[0] if models else None)
    if model is None:
        raise EngineError(f"{base} lists no model; set host.attach.model")
    prof = engine_profile(engine_kind)
    facts = prof.server_info(base, headers)
    info = {"mode": "attached", "base_url": base, "models": models, "version": prof.version(facts),
            "server_info": facts, "headers": sorted(p.headers)}
    return Server(base_url=base, model=model, headers=headers, info=info, tokenizer_dir=p.tokenizer)


def serve(study: Study, config_id: str, *, port: int | None = None, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Start the configuration's engine detached (for studies whose host attaches to it) and
    wait for /health. Writes the handle that `AttachHost.launch` and `stop_served` read."""
    eng_p = resolve_profile(study, config_id)  # derived values (auto) filled in, as the dry run shows
    if port or env:
        eng_p = eng_p.model_copy(update={"port": port or eng_p.port, "env": {**eng_p.env, **(env or {})}})
    model_dir = model_dir_for(eng_p)
    p = served_path(study.study, config_id)
    p.parent.mkdir(parents=True, exist_ok=True)
    eng = Engine(eng_p, model_dir, p.parent / config_id)
    eng.start()
    handle = {**eng.record(), "model_dir": model_dir, "config": config_id}
    write_json(p, handle)
    return handle


def stop_served(study_id: str, config_id: str) -> str:
    p = served_path(study_id, config_id)
    if not p.exists():
        return "no served engine"
    h = read_json(p)
    if not h.get("pid") or not is_engine(h["pid"], {"info": h}):
        return "engine already stopped"
    return stop_process_group(h["pid"])


class AttachHost(Host):
    kind = "attach"
    kinds = ("attach",)
    cost_basis = "endpoint"

    @staticmethod
    def with_url(study: Study, url: str) -> Study:
        """The study attached to `url` instead (servelab run --url)."""
        return study.model_copy(update={"host": study.host.model_copy(
            update={"attach": study.host.attach.model_copy(update={"url": url})})})

    def describe_config(self, config_id: str, command: str) -> list[str]:
        return [f"[{config_id}] attach {self.params_for(config_id).url}", f"[{config_id}] serve: {command}"]

    @property
    def params(self) -> AttachParams:
        assert self.study.host.attach is not None
        return self.study.host.attach

    def params_for(self, config_id: str) -> AttachParams:
        """The attach block with the configuration's own `url` where it names one."""
        url = self.study.config(config_id).url
        return self.params.model_copy(update={"url": url}) if url else self.params

    def _provision(self, config_id: str, rdir: Path, engine: EngineParams) -> dict[str, Any]:
        return {"url": self.params_for(config_id).url}

    def check(self) -> None:
        checked: set[str] = set()
        for c in self.study.configurations:  # an unreachable URL stops before any work, each URL asked once
            p = self.params_for(c.id)
            if p.url not in checked:
                attach(p, self.study.engine_for(c.id).kind)
                checked.add(p.url)

    def launch(self, config_id: str, rdir: Path, engine: EngineParams) -> dict[str, Any]:
        srv = attach(self.params_for(config_id), engine.kind)
        info = dict(srv.info)
        served = served_path(self.study.study, config_id)
        if served.exists():  # started by `servelab serve`: keep its command, env, start-up time
            info["served"] = read_json(served)
            for k in ("command", "startup_s", "env", "server_info"):
                if info["served"].get(k) is not None:
                    info[k] = info["served"][k]
        return {"mode": "attached", "base_url": srv.base_url, "model": srv.model, "info": info,
                "tokenizer_dir": srv.tokenizer_dir or (info.get("served") or {}).get("model_dir"),
                "served_pid": (info.get("served") or {}).get("pid")}

    def client_headers(self, config_id: str, handle: dict[str, Any]) -> dict[str, str]:
        return attach(self.params_for(config_id), self.study.engine_for(config_id).kind).headers

    def weights_known(self, handle: dict[str, Any]) -> bool:
        return bool(handle["info"].get("served"))

    def engine_on_this_machine(self, handle: dict[str, Any]) -> bool:
        return False
