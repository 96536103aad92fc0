"""Planned against measured, term by term, and the drift per engine."""

from __future__ import annotations

import pytest

from planning.measured import compare, drift, measured_need, need_difference

GIB = 2**30


PLANNED = {
    "weights": 15 * GIB,
    "kv": 1 * GIB,
    "activation": 2 * GIB,
    "non_torch": GIB // 4,
    "comm_buffers": GIB,
    "cuda_graph": GIB,
    "kv_tokens": 400_000,
    "budget": 72 * GIB,
}
MEASURED = {  # what the stand-in (or vLLM) logged
    "weights": 15 * GIB,
    "activation": GIB,
    "non_torch": GIB // 4,
    "kv_cache": 40 * GIB,
    "sequences": 40.0,
    "kv_tokens": 327_680,
}


def test_each_term_beside_its_measure():
    rows = {r.term: r for r in compare(PLANNED, MEASURED)}
    assert rows["weights"].difference == 0
    assert rows["kv"].measured == GIB  # 40 GiB of pool over 40 sequences
    assert rows["activation"].difference == 1.0  # planned twice what the engine took
    assert rows["non_torch"].planned == GIB // 4 + GIB  # with the communication buffers
    assert rows["cuda_graph"].measured is None  # not logged: not compared
    # The need over the terms measured only: 15 + 1 + 2 + 1.25 planned, 15 + 1 + 1 + 0.25 logged.
    assert rows["need"].planned == 15 * GIB + GIB + 2 * GIB + GIB // 4 + GIB
    assert rows["need"].measured == 15 * GIB + GIB + GIB + GIB // 4
    assert rows["kv_tokens"].measured == 327_680


def test_the_measured_need_is_one_sequence_of_the_pool():
    assert measured_need(MEASURED) == 15 * GIB + GIB + GIB // 4 + GIB
    assert measured_need({}) is None


def test_drift_is_kept_per_engine():
    over = dict(MEASURED, activation=2 * GIB, non_torch=GIB // 4 + GIB)
    got = drift([("vllm", PLANNED, MEASURED), ("vllm", PLANNED, over), ("sglang", PLANNED, {})])
    assert list(got) == ["vllm"]
    mean, count = got["vllm"]
    assert count == 2
    assert mean == pytest.approx((need_difference(PLANNED, MEASURED) + 0.0) / 2)
