"""Memory terms by engine release (planning/engines.toml: [<engine>.memory] for the current
releases, [[<engine>.older_memory]] for older ranges) and what each release's knobs mean."""

from __future__ import annotations

import pytest

from planning.enginememory import release_key
from planning.engines import RegistryError, load_registry, terms_for
from planning.memory import card_memory
from planning.units import GIB
from tests.planning.calibration import LLAMA_3_8B


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("0.19.0", (0, 19, 0)),
        ("v0.10.1.1", (0, 10, 1, 1)),
        ("0.6.4.post1", (0, 6, 4)),
        ("0.11.0rc2", (0, 11, 0)),
        ("b6123", (6123,)),
        ("", None),
        ("latest", None),
    ],
)
def test_a_release_reads_as_numbers_to_compare(text, key):
    assert release_key(text) == key


@pytest.mark.parametrize(
    ("release", "described"),
    [
        ("0.6.4.post1", "vLLM 0.6.4 to 0.10"),
        ("0.10.1.1", "vLLM 0.6.4 to 0.10"),
        ("0.5.0", "vLLM 0.6.4 to 0.10"),  # older than the table: the oldest terms, not the current ones
        ("0.11.0", "vLLM 0.11 to 0.16"),
        ("0.16.1", "vLLM 0.11 to 0.16"),
        ("0.17.0", "vLLM 0.17 to 0.20"),
        ("0.19.0", "vLLM 0.17 to 0.20"),
        ("0.21.0", "vLLM 0.21 and later"),
        ("0.31.0", "vLLM 0.21 and later"),
        ("", "vLLM 0.21 and later"),  # blank: the current releases' terms
    ],
)
def test_each_release_gets_the_terms_of_its_range(release, described):
    assert terms_for("vllm", release).memory.version.startswith(described)


def test_the_stand_in_plans_as_vllm_release_by_release():
    assert terms_for("standin", "0.19.0").memory.version == terms_for("vllm", "0.19.0").memory.version


def _memory(release, args=()):
    return card_memory(
        terms_for("vllm", release), LLAMA_3_8B, 1, 8192, None, total=round(79.19 * GIB), args=args
    )


def test_graphs_are_outside_the_budget_from_0_11_to_0_20_and_inside_from_0_21():
    before, after = _memory("0.19.0"), _memory("0.21.0")
    assert before is not None and after is not None
    graph_before = next(t for t in before.terms if t.name == "cuda_graph")
    graph_after = next(t for t in after.terms if t.name == "cuda_graph")
    assert not graph_before.inside and "outside the budget" in graph_before.how
    assert graph_after.inside
    # counted in the need only where the release counts them in its budget
    for memory in (before, after):
        inside = sum(t.bytes for t in memory.terms if t.inside)
        assert memory.need == memory.weights + memory.kv + inside
    assert graph_after.bytes in {t.bytes for t in after.terms if t.inside}
    assert graph_before.bytes not in {t.bytes for t in before.terms if t.inside}


def test_from_0_17_the_profiles_sampler_holds_four_copies_of_the_logits_not_ten():
    # vllm-project/vllm#33538 (v0.17.0): top-k/top-p masked in place by a Triton kernel, no sort. On an H100
    # (1024 sequences by default) Llama-3.1-8B's sampler was the peak at ten copies; at four it is 1.96 GiB,
    # inside the 1.1-3.7 GiB the issue measured under 0.19 where ten copies planned 4.9.
    logits = 1024 * 128256 * 4
    before, after = _memory("0.16.1"), _memory("0.19.0")
    assert before is not None and after is not None
    activation_before = next(t for t in before.terms if t.name == "activation")
    activation_after = next(t for t in after.terms if t.name == "activation")
    assert activation_before.bytes == 10 * logits and "sampler: 10 x 1024" in activation_before.how
    assert activation_after.bytes == 4 * logits and "sampler: 4 x 1024" in activation_after.how
    assert 1.1 * GIB <= activation_after.bytes <= 3.7 * GIB
    assert "#33538" in activation_after.source


def test_a_pinned_kv_pool_sets_the_budget_in_place_of_the_fraction():
    pool = 20 * GIB
    memory = _memory("0.19.0", ("--kv-cache-memory-bytes", str(pool), "--gpu-memory-utilization", "0.5"))
    assert memory is not None
    held = memory.weights + memory.overhead
    assert memory.budget == held + pool
    assert "--kv-cache-memory-bytes 20.00 GiB" in memory.budget_how and "is not used" in memory.budget_how
    assert memory.kv_tokens == int(pool / (memory.kv / 8192))
    # the older releases have no such flag: the fraction decides
    old = _memory("0.8.5", ("--kv-cache-memory-bytes", str(pool), "--gpu-memory-utilization", "0.5"))
    assert old is not None and old.budget == int(round(79.19 * GIB) * 0.5)


def test_an_older_table_without_its_end_is_refused(tmp_path):
    text = (
        (__import__("planning.engines", fromlist=["DEFAULT_PATH"]).DEFAULT_PATH)
        .read_text()
        .replace('below = "0.11"\n', "", 1)
    )
    path = tmp_path / "engines.toml"
    path.write_text(text)
    with pytest.raises(RegistryError, match="older_memory.*needs below"):
        load_registry(path)


def test_llamacpp_fitting_itself_to_the_card_is_planned_against_the_card_less_its_margin():
    from planning.engines import engine

    llamacpp = engine("llamacpp")
    total = round(44.99 * GIB)
    plain = card_memory(llamacpp, LLAMA_3_8B, 1, 8192, round(40 * GIB), total=total)
    fitted = card_memory(llamacpp, LLAMA_3_8B, 1, 8192, round(44.5 * GIB), total=total, args=("-fit", "on"))
    target = card_memory(
        llamacpp,
        LLAMA_3_8B,
        1,
        8192,
        round(44.5 * GIB),
        total=total,
        args=("--fit", "on", "--fit-target", "4096"),
    )
    assert plain is not None and fitted is not None and target is not None
    assert plain.budget == round(40 * GIB) and plain.budget_how == "the class's usable memory"
    assert fitted.budget == total - 1024 * 2**20 and "--fit-target 1024 MiB (--fit on)" in fitted.budget_how
    assert target.budget == total - 4096 * 2**20
    # the class's usable memory still caps it
    capped = card_memory(llamacpp, LLAMA_3_8B, 1, 8192, round(30 * GIB), total=total, args=("--fit", "on"))
    assert capped is not None and capped.budget == round(30 * GIB) and "capped" in capped.budget_how
