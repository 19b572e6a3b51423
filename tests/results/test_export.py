"""Round trips: a servelab run (measured against this machine's vLLM CPU server) written in each
tool's format and imported back gives the same per-request metrics, as far as the format holds them
(results.export says what each one keeps)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from paths import FIXTURES
from servelab.analysis.harmonise import recompute_per_request
from servelab.results.export import FORMATS, export
from servelab.results.importer import import_files
from servelab.runfolder import load_records
from servelab.summary import itl_values

RUN = FIXTURES / "imports" / "servelab-c4"
PER_REQUEST = ["ttft_s", "e2e_s", "output_tokens", "prompt_tokens", "decode_tps", "tpot_s", "e2e_output_tps",
               "start_s", "end_s"]
# what a format cannot hold (results.export): compared separately below
LOST = {"sglang-bench": {"e2e_s", "decode_tps", "tpot_s", "e2e_output_tps", "start_s", "end_s"},
        "guidellm": set()}


@pytest.fixture(scope="module")
def original():
    return recompute_per_request(load_records(RUN)).sort_values("seq").reset_index(drop=True)


@pytest.fixture(scope="module", params=FORMATS)
def back(request, original, tmp_path_factory):
    d = tmp_path_factory.mktemp(request.param)
    files = export(RUN, request.param, d / "files")
    res = import_files(files, out=d / "run", bucket=str(original["bucket"].iloc[0]))
    recs = load_records(res.path).sort_values("seq").reset_index(drop=True)
    return request.param, recs


def test_the_same_requests_come_back(original, back):
    fmt, recs = back
    assert len(recs) == len(original)
    assert recs["ok"].tolist() == original["ok"].tolist()
    assert (recs["concurrency"] == original["concurrency"]).all() and (recs["bucket"] == original["bucket"]).all()


def test_the_same_per_request_metrics_come_back(original, back):
    fmt, recs = back
    for col in PER_REQUEST:
        if col in LOST.get(fmt, set()):
            continue
        a, b = original[col].astype(float).to_numpy(), recs[col].astype(float).to_numpy()
        np.testing.assert_allclose(b, a, rtol=1e-9, atol=1e-9, err_msg=f"{fmt}: {col}")


def test_chunk_gaps_come_back_where_the_format_keeps_them(original, back):
    fmt, recs = back
    if fmt == "guidellm":  # first and last token only: no pooled ITL, said so (tool_definitions.yaml)
        assert all(len(t) == 1 for t in recs["chunk_times_s"])
        return
    np.testing.assert_allclose(itl_values(recs), itl_values(original), rtol=1e-9, atol=1e-9)


def test_sglang_ends_e2e_at_the_last_text_chunk(original, back):
    fmt, recs = back
    if fmt != "sglang-bench":
        pytest.skip("only SGLang's format lacks the per-request latency")
    last = pd.Series([t[-1] for t in original["chunk_times_s"]])
    np.testing.assert_allclose(recs["e2e_s"].astype(float), last, rtol=1e-9)
    assert (recs["e2e_s"] <= original["e2e_s"]).all()  # short of [DONE] by the stream's tail
