"""One configuration, resolved once: `ConfigPlan` (the study, the configuration, its engine set-up
with the profile's derived values applied, its workload, and the study's host).

The pipeline builds the host once per study run (`hosts.for_study`) and a plan per
configuration (`plan_study`), then hands them to the stages; nothing below re-derives them.
Across papermill kernels the run folder stays the contract: a stage notebook rebuilds its plan
once at its top from the study file the pipeline wrote there (`load_plan`). Not for running
anything (`stages`, `pipeline`)."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from . import engines, hosts
from .hosts import Host
from .paths import resolve
from .schema import Configuration, EngineParams, Study, Workload, load_study, resolve_profile


@dataclass(frozen=True)
class ConfigPlan:
    """What one configuration runs with, decided in one place (frozen: rooms below read it)."""

    study: Study
    config: Configuration
    #: the configuration's engine set-up with the profile's derived values (`auto`) filled in: what launches
    engine: EngineParams
    #: the study's workload with the configuration's overrides
    workload: Workload
    #: the study's host, shared by every configuration of one run (stateful for AWS)
    host: Host

    @property
    def config_id(self) -> str:
        return self.config.id

    @property
    def profile(self) -> engines.EngineProfile:
        return engines.get(self.engine.kind)

    def command(self, python: str | None = None) -> list[str]:
        """The engine's argv as the dry run shows it (the model as given, or a placeholder)."""
        eng = self.engine
        model = (eng.model.path or f"<model:{eng.model.preset}>") if eng.model else "<model>"
        return engines.build_command(eng, model, python)

    def launch_lines(self, python: str | None = None) -> list[str]:
        """What launching this configuration starts or reaches, in the host's words."""
        return self.host.describe_config(self.config_id, shlex.join(self.command(python)))


def plan_config(study: Study, config_id: str, host: Host) -> ConfigPlan:
    """The plan of one configuration on `host` (the one made for this study run)."""
    return ConfigPlan(study=study, config=study.config(config_id), engine=resolve_profile(study, config_id),
                      workload=study.workload_for(config_id), host=host)


def plan_study(study: Study, host: Host | None = None) -> dict[str, ConfigPlan]:
    """Every configuration's plan, in the study's order, sharing one host (made here when not given)."""
    host = host or hosts.for_study(study)
    return {c.id: plan_config(study, c.id, host) for c in study.configurations}


def load_study_file(params_path: str | Path, reduced: bool = False) -> Study:
    """The study of a params file (relative paths from the repository root, wherever the
    kernel started), with its reduced workload when asked."""
    s = load_study(resolve(params_path))
    return s.reduced_copy() if reduced else s


def load_plan(params_path: str | Path, config_id: str, reduced: bool = False) -> ConfigPlan:
    """A stage notebook's plan, rebuilt once at its top from the study file in the run folder
    (params.effective.yaml, written by the pipeline) with a host of its own: the host reads what
    an earlier kernel left (AWS: the state file)."""
    study = load_study_file(params_path, reduced)
    return plan_config(study, config_id, hosts.for_study(study))


__all__ = ["ConfigPlan", "plan_config", "plan_study", "load_plan", "load_study_file"]
