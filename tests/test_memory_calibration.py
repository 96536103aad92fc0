"""The memory model held to logged engine start-ups (tests/calibration.py):
the planned per-card need within 10% of the logged need, and never below it
by more than 5%, for every point held."""

from __future__ import annotations

import pytest

from tests.calibration import NOT_HELD, POINTS, plan

HELD = [p for p in POINTS if not p.excluded]


@pytest.mark.parametrize("point", HELD, ids=[f"{p.model}-tp{p.tp}-{p.context}" for p in HELD])
def test_planned_need_is_within_ten_percent_and_never_five_below_the_logged(point):
    compared = plan(point)
    assert -0.05 <= compared.error <= 0.10, (
        f"{point.model} at TP {point.tp}: planned {compared.planned:.2f} GiB, logged {point.need:.2f} "
        f"({compared.error:+.1%}); {point.source}"
    )


def test_every_point_names_its_source_and_its_engine_version():
    for point in POINTS:
        assert point.source.startswith("https://github.com/")
        assert point.version
    for source, why in NOT_HELD:
        assert source.startswith("https://") and why


def test_a_point_excluded_from_the_bound_says_why():
    for point in POINTS:
        if point.excluded:
            assert len(point.excluded) > 20


def test_the_kv_term_matches_the_engines_own_sequence_figure():
    # Where the log gives the KV cache and its maximum concurrency, one
    # sequence's cache is their quotient; the planner's figure for the same
    # context must be within 2% (block rounding).
    for point in HELD:
        if point.kv is None:
            continue
        compared = plan(point)
        assert compared.memory.kv / 2**30 == pytest.approx(point.kv, rel=0.02), point.source


def test_the_flat_overhead_of_the_old_model_misses_points_the_new_one_holds():
    # The old planner: weights + KV + a flat 1.5 GiB. It passes under the
    # bound on at least one held point that the new model holds.
    misses = 0
    for point in HELD:
        compared = plan(point)
        old = (
            compared.memory.weights / 2**30
            + (compared.memory.kv / 2**30 if point.kv is not None else 0)
            + 1.5
        )
        if old / point.need - 1 < -0.05:
            misses += 1
    assert misses >= 1


def test_the_held_points_cover_the_attention_kinds_and_tp_widths():
    # What the table holds today (docs/memory-model.md says what it still lacks):
    # every kind below at least once, and start-ups at TP 1, 2 and 4.
    kinds = " ".join(p.kind for p in HELD)
    for kind in ("GQA", "MLA", "MoE", "quantized"):
        assert kind in kinds, kind
    assert {1, 2, 4} <= {p.tp for p in HELD}
    assert len({p.model for p in HELD}) >= 8
    assert len(HELD) >= 10


# vllm-project/vllm#21348: Qwen3-235B-A22B-FP8 on 4 x H100, the same checkpoint
# under both engines. vLLM: "Available KV cache memory: 8.11 GiB", "GPU KV cache
# size: 178,880 tokens"; SGLang: "KV Cache is allocated. #tokens: 367404, K size:
# 8.23 GB, V size: 8.23 GB" (SGLang's GB is 2**30 bytes).
QWEN3_235B_KV_SOURCE = "https://github.com/vllm-project/vllm/issues/21348"


@pytest.mark.parametrize(
    ("engine_name", "cache_gib", "tokens", "tolerance"),
    [("vllm", 8.11, 178_880, 0.02), ("sglang", 8.23 + 8.23, 367_404, 0.005)],
)
def test_one_tokens_kv_bytes_a_card_at_tp4_match_both_engines_logs(engine_name, cache_gib, tokens, tolerance):
    # Four KV heads over four cards: one head a card. The planner's bytes a
    # token a card must be the engine's cache over its tokens (vLLM rounds
    # its pool down to whole blocks of every layer, hence 2%).
    from catalog.planning.engines import engine
    from catalog.planning.memory import kv_per_card
    from tests.calibration import GIB, QWEN3_235B_A22B

    kv = kv_per_card(engine(engine_name), QWEN3_235B_A22B, 4, 4096)
    assert kv is not None
    planned_per_token = kv[0] / 4096
    logged_per_token = cache_gib * GIB / tokens
    assert planned_per_token == pytest.approx(logged_per_token, rel=tolerance), QWEN3_235B_KV_SOURCE
    # and not the whole model's figure, nor one split past the KV heads
    whole = QWEN3_235B_A22B.kv_bytes_per_token
    assert whole is not None and planned_per_token == whole / 4
