"""Diagnosis of runs: pure functions of records, summaries and server samples already on disk.

`prefill` (TTFT vs prompt length), `saturation` (knee, goodput under the SLO), `kv` (KV-cache
residency and capacity), `roofline` (hardware bounds), `speculative` (acceptance, A/B,
capture sizes), `compare` (one change at a time), `symptoms` (observation -> first check), `cost`
(self-host vs managed), `peers` (other tools' results). Each finding says what the numbers
show (as numbers and `phrase.Phrase`s the report words) and which symptom rule applies;
none of it talks to a server.
"""

from .compare import compare_configs, config_diff, flatten
from .kv import kv_capacity, kv_capacity_check, kv_residency, kv_timeseries, kv_verdict, parse_size_bytes
from .prefill import fit_prefill
from .saturation import KNEE_GAIN_PER_DOUBLING, goodput, knee, saturation, slo_check
from .speculative import capture_size_warnings, spec_ab, spec_stats
from .stats import fit_ttft
from .symptoms import RULES, Finding, symptoms

__all__ = ["compare_configs", "config_diff", "flatten", "kv_capacity", "kv_capacity_check", "kv_residency",
           "kv_timeseries", "kv_verdict", "parse_size_bytes", "fit_prefill", "KNEE_GAIN_PER_DOUBLING", "goodput",
           "knee", "saturation", "slo_check", "capture_size_warnings", "spec_ab", "spec_stats", "fit_ttft",
           "RULES", "Finding", "symptoms"]
