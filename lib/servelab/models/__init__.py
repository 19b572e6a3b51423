"""Offline model directories (`build.make_model`), their presets, and architecture facts
(`facts.model_facts`, `facts.kv_bytes_per_token`; the counts from the library, `arch.library_facts`)."""

from .arch import ArchitectureError
from .build import default_cache_root, make_model
from .facts import facts_from_config, kv_bytes_per_token, model_facts
from .presets import PRESETS, list_presets

__all__ = ["ArchitectureError", "make_model", "default_cache_root", "model_facts", "facts_from_config", "kv_bytes_per_token",
           "PRESETS", "list_presets"]
