"""The planner's SGLang terms held to logged SGLang start-ups (tests/planning/calibration_sglang.py says
what SGLang's logged need is): the static need within 5% and never under, the pool never more tokens
than SGLang allocated; and the table and the issue's count say how many of them name their release."""

from __future__ import annotations

import pytest

from planning.engines import terms_for
from tests.planning.calibration import NOT_HELD, UNCALIBRATED, table
from tests.planning.calibration_sglang import POINTS, STORED, named, plan_sglang


@pytest.mark.parametrize("point", POINTS, ids=[f"{p.model}-tp{p.tp}" for p in POINTS])
def test_an_sglang_start_ups_static_need_is_planned_within_five_percent_and_never_under(point):
    compared = plan_sglang(point)
    assert 0 <= compared.error <= 0.05, (
        f"{point.model} at TP {point.tp}: planned {compared.planned:.2f} GiB, logged {point.need:.2f} "
        f"({compared.error:+.1%}); {point.source}"
    )


@pytest.mark.parametrize("point", POINTS, ids=[f"{p.model}-tp{p.tp}" for p in POINTS])
def test_the_planned_pool_never_holds_more_tokens_than_sglang_allocated(point):
    # more tokens than logged would promise contexts the engine cannot hold; fewer is the safe side
    compared = plan_sglang(point)
    assert -0.05 <= compared.tokens_error <= 0.002, (point.model, compared.tokens, point.tokens)
    # the logged figures themselves follow the rule the planner uses: the fraction of what was free
    # before the weights, less the weights, is the K and V SGLang allocated
    assert point.free_before * point.fraction - point.weights == pytest.approx(point.kv, abs=0.02)


def test_the_weights_and_pool_terms_are_the_logged_ones_term_by_term():
    # the need is held before the weights + weights + pool on both sides, each within 0.25 GiB
    for point in POINTS:
        compared = plan_sglang(point)
        assert compared.weights == pytest.approx(point.weights, abs=0.01)
        assert abs(compared.held_before - point.held_before) <= 0.25
        assert abs(compared.pool - point.kv) <= 0.25
        # what start-up took of the reserve beside the pool fits in the planned reserve
        if point.pool_end is not None:
            assert point.free_before - point.weights - point.kv - point.pool_end < compared.reserved


def test_a_start_up_whose_log_names_no_release_calibrates_no_range_and_the_table_says_so():
    # A source build's start-up is held to the bound but counts for no release range; the table and the
    # engine's note say how many named-release start-ups hold SGLang's terms (none found yet).
    counted = [p for p in POINTS if named(p)]
    assert counted == []
    text = table()
    assert terms_for("sglang", None).memory.version in text
    assert text.count("(release not named: not counted)") == len(POINTS)
    assert "0 named-release points" in UNCALIBRATED["sglang"]
    assert f"{len(POINTS)} start-ups" in UNCALIBRATED["sglang"]


def test_every_sglang_log_seen_names_its_source_and_why_it_is_not_held():
    for point in POINTS:
        assert point.source.startswith(("https://", STORED)) and point.card_source and point.notes
    sglang_seen = [(s, why) for s, why in NOT_HELD if "SGLang" in why or "sglang" in why.lower()]
    assert len(sglang_seen) >= 10
    for source, why in sglang_seen:
        assert source.startswith(("https://", STORED)) and len(why) > 40
