"""What a page can and cannot say about an engine servelab did not start: a server that already ran
at a URL (`servelab bench URL --html`, an attach study without a model) is known only by what it
answers (its model, its version, its metrics and every request's timing); its flags, its weights and
its start-up time are not, and the page says so instead of showing defaults as if they were its
settings. Not for engines that `servelab serve` started for an attach study (their command, flags
and start-up time are recorded) nor for the numbers (`analysis`)."""

from __future__ import annotations

from .load import StudyData


def not_started(sd: StudyData) -> list[str]:
    """The configurations whose engine servelab neither started nor was told about: attached, no
    launch command recorded, and no model named in the study."""
    out = []
    for cid in sd.config_ids:
        run = sd.info(cid)
        params = sd.engine_params(cid)
        if run.server.mode == "attached" and not run.server.command and not params.get("model"):
            out.append(cid)
    return out


def engine_not_started_text(sd: StudyData) -> str:
    """The set-up paragraph for such configurations ("" when there are none): where the server answered,
    what the page shows of it and what it cannot know."""
    cids = not_started(sd)
    if not cids:
        return ""
    lab = sd.labels()
    first = sd.info(cids[0])
    engine = " ".join(x for x in (sd.engine_params(cids[0]).get("kind"), first.server.version) if x)
    return sd.w("attached.not_started", configs=sd.w("story.count_sep").join(lab.get(c, c) for c in cids),
                url=first.server.base_url or sd.w("repro.not_recorded"), engine=engine or sd.w("repro.not_recorded"))


def unknown(sd: StudyData, cid: str) -> str | None:
    """The repro card's word for a setting of an engine servelab did not start; None for the others."""
    return sd.w("attached.unknown") if cid in not_started(sd) else None
