"""The write-up: a published study loaded once (`load`), its story (`sections`), diagnosis
(`diagnosis`), money and peers (`money`), GPU telemetry (`gpu`), figures (`plots`), the words in
both languages (`i18n`), the HTML primitives and page template (`html`, `render`), the page
check (`lint`) and the index page (`index`). The write-up notebook calls these; each is a pure
function of the study's files."""

from .load import StudyData, baselines, engine_gpus, load_study_data

__all__ = ["StudyData", "load_study_data", "baselines", "engine_gpus"]
