"""The resize and context services against the database: what is saved, audited and worked out.

Memory figures are worked out by hand here, from the shapes the demo fleet seeds (real Hugging Face
configs), not by calling the planner's own arithmetic.
"""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command
from django.db import OperationalError, connection
from django.test.utils import CaptureQueriesContext

from audit.models import AuditEntry
from audit.services import verify_chain
from base.actor import Actor
from base.errors import DomainError
from catalog.models import Card, Node, Profile, ServedModel
from operations.services.resize import model_resize, model_set_context
from tests.support import builders as b

pytestmark = pytest.mark.django_db

GIB = 2**30
MIB = 2**20


def serving(p: Profile) -> tuple:
    p.refresh_from_db()
    return (p.gpus_per_node, p.tp, p.nodes, p.pp, p.args, p.env, p.revision)


@pytest.fixture
def seeded(db):
    call_command("seed_demo", "--as", "seeder", stdout=StringIO())
    return AuditEntry.objects.count()


# -- memory on the seeded shapes, worked out by hand ------------------------------------------


def test_mla_cache_is_not_split_when_deepseek_v2_lite_spreads_over_four_a100s(seeded, actor):
    change = model_resize(name="deepseek-v2-lite", gpus=4, dry_run=True)
    # The seeded total_size: MLA's down-projections and the MoE router gates
    # ((27 x 2048 x 576 + 26 x 2048 x 64) x 2 bytes, ReplicatedLinear in vLLM)
    # stay whole on each card, the rest splits 4 ways.
    replicated = (27 * 2048 * 576 + 26 * 2048 * 64) * 2
    weights = -(-(31_412_968_448 - replicated) // 4) + replicated
    kv = 31_104 * 16_384  # MLA: 512+64 latent dims x 27 layers x 2 bytes a token, for --max-model-len 16384
    # vLLM's terms at TP 4 for the seeded fleet's default release, 0.19.1 (engines.toml, the 0.17 to 0.20
    # table): the sampler's peak, 4 copies of 256 sequences x 102400 vocabulary fp32 logits, on top of the
    # fused-MoE workspaces the forward pass of 2048 batch tokens leaves (6 experts a token x (max(1408/4,
    # 2048) + max(2 x 1408/4, 2048)) + 2048 values of 2 bytes a token), and outside PyTorch 0.25 GiB; CUDA
    # graphs are captured after the cache is sized, beside the budget, so not in the need; no NVLink
    # communication buffers on a 40 GiB card (they start at 70 GiB).
    overhead = 4 * 256 * 102_400 * 4 + 2048 * 2 * (6 * (2048 + 2048) + 2048) + round(0.25 * GIB)
    m = change.memory
    assert (m.cards, m.weights, m.kv, m.overhead, m.context) == (4, weights, kv, overhead, 16_384)
    assert m.need == weights + kv + overhead
    assert m.budget == 36_860 * MIB  # the class's usable memory is below 0.9 of the card
    assert change.per_card == "8.6 GiB on each of 4 cards, of 36 GiB usable on each"
    assert change.memory.fits


def test_kv_cache_stops_shrinking_at_one_kv_head_a_card_for_qwen3_on_eight_cards(seeded, actor):
    b.node("gpu-h8", cards=8, cls=b.gpu_class("h100-80g"))  # the seeded nodes have no 8 free
    change = model_resize(name="qwen3-30b-a3b", gpus=8, dry_run=True)
    kv_total = 98_304 * 32_768  # 2 x 48 layers x 4 KV heads x 128 x 2 bytes a token, --context-length 32768
    assert change.memory.kv == kv_total // 4  # 4 KV heads: a card never holds less than one head's cache
    # The MoE router gates (48 layers x 2048 x 128 experts x 2 bytes) stay
    # whole on every card; the rest splits 8 ways.
    gates = 48 * 2048 * 128 * 2
    assert change.memory.weights == -(-(61_064_245_248 - gates) // 8) + gates
    # SGLang's budget holds weights and KV cache, and what the card held before the weights loaded
    # (0.70 GiB, and 2.0 GiB of torch distributed init at TP > 1 on a card of 70 GiB or more:
    # planning/engines.toml [sglang.memory]); activations and graphs live in the rest of the card,
    # outside --mem-fraction-static.
    before_weights = -(-(70 + 200) * GIB // 100)
    assert change.memory.overhead == before_weights
    assert change.memory.need == change.memory.weights + kv_total // 4 + before_weights
    assert change.room.beside == ("gpu-h8",)


def test_freetoken_keeps_experts_in_ram_and_counts_sliding_layers_at_their_window(seeded, actor):
    change = model_set_context(name="gpt-oss-20b", tokens=131_072, dry_run=True)
    dense = 13_761_264_768 - 10_152_345_600  # weights without the routed experts
    # 24 layers at 49152 bytes a token: 12 full layers keep 131072 tokens, 12 sliding ones keep 128.
    kv = 49_152 * (12 * 131_072 + 12 * 128) // 24
    assert (change.memory.weights, change.memory.kv, change.memory.overhead) == (dense, kv, GIB)
    assert change.memory.budget == 41_460 * MIB
    assert change.args == ("--max-seq-len-override", "131072")
    assert (change.before, change.after, change.kind) == (32_768, 131_072, "context")


def test_llamacpp_splits_layers_so_weights_and_cache_both_divide(seeded, actor):
    # The demo's llama.cpp model is planned from the GGUF it made: Mistral-7B's
    # tensors at Q4_K (144 bytes a 256 values), the output at Q6_K (210), the
    # norms at F32, and the file's size is the weights.
    per_layer = (4096 * 4096 * 2 + 1024 * 4096 * 2 + 14336 * 4096 * 3) * 144 // 256 + 2 * 4096 * 4
    data = 32 * per_layer + 32768 * 4096 * 144 // 256 + 32768 * 4096 * 210 // 256 + 4096 * 4
    assert data == 4_112_531_456
    model = ServedModel.objects.get(name="mistral-7b")
    assert model.source.endswith("Mistral-7B-Instruct-v0.3-Q4_K_M.gguf") and model.dtype == "Q4_K_M"
    assert 0 < model.weight_bytes - data < 1_000_000  # the header: metadata and 32768 tokens
    change = model_resize(name="mistral-7b", gpus=4, dry_run=True)
    assert change.memory.weights == -(-model.weight_bytes // 4)
    assert change.memory.kv == 131_072 * 16_384 // 4
    # llama.cpp's compute buffer (engines.toml [llamacpp.memory]): its layer phase at 16384 cells, 3 FFN rows
    # and a hidden row of fp32 a 512-token ubatch and a 6-byte mask a cell a token
    assert change.memory.overhead == 4 * 512 * (3 * 14336 + 4096) + 512 * 16_384 * 6
    assert change.per_card == "1.6 GiB on each of 4 cards, of 40.5 GiB usable on each"


def test_a_profile_too_big_for_its_cards_is_refused_with_both_ways_out_and_nothing_saved(actor):
    l4 = b.gpu_class("l4-24g", memory_mib=23034, usable_mib=20000, capability="8.9")
    b.node("gpu-l", cards=4, cls=l4)
    p = b.profile(b.llama_8b(), "l4", cls=l4, gpus=2, args=["--max-model-len", "131072"])
    before = serving(p)
    weights, kv, overhead = (
        16_060_522_496,
        131_072 * 131_072,
        round(0.35 * GIB) + GIB,
    )  # TP 1: no comm buffers
    budget = 20_000 * MIB
    assert weights + kv + overhead > budget  # one card is too small ...
    assert weights // 2 + kv // 2 + overhead + round(1.8 * GIB) <= budget  # ... two are enough
    # the longest context one card holds, in whole blocks of 16 tokens
    longest = (budget - weights - overhead) // (131_072 * 16) * 16

    with pytest.raises(DomainError) as err:
        model_resize(name="llama-3.1-8b", gpus=1)

    e = err.value
    assert (e.code, e.status) == ("memory", 400)
    assert f"{(weights + kv + overhead) / GIB:.1f} GiB" in e.message  # 32.3: the need
    assert "19.5 GiB usable" in e.message  # the budget
    assert "2 cards would hold it" in e.message and f"at most {longest} tokens" in e.message
    assert longest == 26_400
    assert e.change["memory"]["need"] == weights + kv + overhead and e.change["memory"]["fits"] is False
    assert serving(p) == before and AuditEntry.objects.count() == 0


# -- what is saved -------------------------------------------------------------------------------


def test_a_resize_saves_the_new_layout_bumps_the_revision_and_writes_one_resize_entry(actor):
    b.node("gpu-1", cards=8)
    p = b.profile(
        b.llama_8b(),
        "h100",
        gpus=2,
        args=["--tensor-parallel-size", "2", "--max-model-len", "8192", "-tp=2", "--enable-prefix-caching"],
    )

    change = model_resize(name="llama-3.1-8b", gpus=4)

    assert serving(p) == (4, 4, 1, 0, ["--max-model-len", "8192", "--enable-prefix-caching"], {}, 2)
    assert change.args == ("--max-model-len", "8192", "--enable-prefix-caching")
    (entry,) = AuditEntry.objects.all()
    assert (entry.action, entry.via, entry.actor, entry.object_type, entry.object_repr) == (
        "resize",
        "cli",
        "pytest",
        "profile",
        "llama-3.1-8b/h100",
    )
    assert (entry.before["tp"], entry.after["tp"]) == (2, 4)
    assert (entry.before["gpus_per_node"], entry.after["gpus_per_node"]) == (2, 4)
    assert (entry.before["revision"], entry.after["revision"]) == (1, 2)
    assert "-tp=2" in entry.before["args"] and "-tp=2" not in entry.after["args"]
    assert "2 → 4 cards" in entry.message
    assert verify_chain() == []


def test_a_resize_brings_a_replica_spanning_nodes_onto_one_node(actor):
    b.node("gpu-1", cards=8)
    p = b.profile(b.llama_8b(), "h100", gpus=2, nodes=2, pp=2)  # 2 x 2 = 4 cards over two nodes
    change = model_resize(name="llama-3.1-8b", gpus=8)
    assert (change.before, change.after) == (4, 8)
    assert serving(p)[:4] == (8, 8, 1, 0)


def test_a_context_change_writes_the_engine_flag_drops_its_env_spelling_and_is_audited(actor):
    l40s = b.gpu_class("l40s-48g", memory_mib=46068, usable_mib=41460, capability="8.9")
    b.node("gpu-l", cards=4, cls=l40s)
    m = b.llama_8b("mistral-7b", context_length=32768)
    p = b.profile(
        m,
        "l40s",
        engine="llamacpp",
        cls=l40s,
        gpus=2,
        args=["-c", "4096", "--flash-attn", "on"],
        env={"LLAMA_ARG_CTX_SIZE": "4096", "HF_HUB_OFFLINE": "1"},
    )

    change = model_set_context(name="mistral-7b", tokens=16384)

    assert (change.before, change.after) == (4096, 16384)
    gpn, tp, _, _, args, env, revision = serving(p)
    assert (gpn, tp, revision) == (2, 1, 2)
    assert args == ["--flash-attn", "on", "--ctx-size", "16384"]
    assert env == {"HF_HUB_OFFLINE": "1"}
    (entry,) = AuditEntry.objects.all()
    assert entry.action == "set_context"
    assert (entry.before["args"], entry.after["args"]) == (["-c", "4096", "--flash-attn", "on"], args)


def test_a_llamacpp_resize_drops_the_old_split_from_args_and_env_and_keeps_tp_1(actor):
    b.node("gpu-1", cards=8)
    p = b.profile(
        b.llama_8b(),
        "gguf",
        engine="llamacpp",
        gpus=2,
        args=["--tensor-split", "1,1", "-ts=3,1", "--ctx-size", "8192"],
        env={"LLAMA_ARG_TENSOR_SPLIT": "1,1", "HF_HUB_OFFLINE": "1"},
    )
    model_resize(name="llama-3.1-8b", gpus=4)
    assert serving(p)[:6] == (4, 1, 1, 0, ["--ctx-size", "8192"], {"HF_HUB_OFFLINE": "1"})


def test_a_dry_run_answers_what_the_change_would_be_and_saves_nothing(actor):
    b.node("gpu-1", cards=8)
    p = b.profile(b.llama_8b(), "h100", gpus=1, args=["--max-model-len", "32768"])
    before = serving(p)

    preview = model_resize(name="llama-3.1-8b", gpus=2, dry_run=True)
    assert serving(p) == before and AuditEntry.objects.count() == 0

    done = model_resize(name="llama-3.1-8b", gpus=2)
    assert preview == done  # the preview is the change itself
    assert serving(p) != before


def test_a_refusal_after_planning_saves_nothing(actor):
    b.node("gpu-1", cards=8)
    p = b.profile(b.llama_8b(), "h100", gpus=2)
    before = serving(p)
    with pytest.raises(DomainError) as err:
        model_resize(name="llama-3.1-8b", gpus=3)
    assert err.value.code == "heads" and err.value.change["after"] == 3
    assert serving(p) == before and AuditEntry.objects.count() == 0


def test_a_second_identical_resize_is_refused_as_unchanged(actor):
    b.node("gpu-1", cards=8)
    b.profile(b.llama_8b(), "h100", gpus=1)
    model_resize(name="llama-3.1-8b", gpus=2)
    with pytest.raises(DomainError) as err:
        model_resize(name="llama-3.1-8b", gpus=2)
    assert err.value.code == "unchanged" and "already uses 2 cards" in err.value.message
    assert AuditEntry.objects.count() == 1


def test_a_model_of_unknown_shape_is_resized_and_says_once_what_was_not_checked(actor):
    b.node("gpu-1", cards=8)
    m = ServedModel.objects.create(name="mystery", source="org/mystery")
    p = b.profile(m, "h100", gpus=1)
    change = model_resize(name="mystery", gpus=2)
    assert change.memory is None and change.per_card == ""
    # once for the shape; the node's agent never reported, so its release floors are said apart
    assert change.note.count("what each card holds") == 1
    assert "KV heads" in change.note
    assert "of gpu-1 are not known" in change.note and "floors and the release are not checked" in change.note
    assert serving(p)[:2] == (2, 2)


def test_only_live_replicas_left_on_the_old_revision_are_restarted(actor):
    n = b.node("gpu-1", cards=8)
    p = b.profile(b.llama_8b(), "h100", gpus=1)
    live = b.replica(p, n, [0])
    b.replica(p, n, [1], state="stopped")  # not live: not restarted
    change = model_resize(name="llama-3.1-8b", gpus=2)
    assert change.restarted == 1
    from operations.models import RestartOperation

    op = RestartOperation.objects.get(pk=change.operation)
    assert list(op.steps.values_list("old_replica", flat=True)) == [live.pk]


def test_declared_model_refusal_names_where_to_change_it_even_without_a_recorded_file(actor, settings):
    settings.LLMGW_CLUSTER_SETTINGS = "/etc/llmgw/cluster.toml"
    b.profile(b.llama_8b(declared=True), "h100")
    with pytest.raises(DomainError) as err:
        model_resize(name="llama-3.1-8b", gpus=2)
    assert (err.value.code, err.value.status) == ("declared", 409)
    assert "/etc/llmgw/cluster.toml" in err.value.message
    assert "sync_cluster_settings" in err.value.message
    assert "( (" not in err.value.message


# -- room -------------------------------------------------------------------------------------------


def test_in_place_frees_only_the_resized_profiles_cards_not_the_other_profiles(actor):
    n = b.node("gpu-1", cards=4)
    m = b.llama_8b()
    short = b.profile(m, "short", gpus=2, args=["--max-model-len", "8192"])
    long = b.profile(m, "long", gpus=2)
    b.replica(short, n, [0, 1])
    b.replica(long, n, [2, 3])
    # Stopping "short" frees 2 cards; "long" keeps the other 2: 4 never come free.
    with pytest.raises(DomainError) as err:
        model_resize(name="llama-3.1-8b", gpus=4, profile="short", in_place=True)
    assert err.value.code == "no_room"
    assert AuditEntry.objects.count() == 0


def test_in_place_asked_with_room_beside_is_still_a_rolling_restart(actor):
    n = b.node("gpu-1", cards=8)
    p = b.profile(b.llama_8b(), "h100", gpus=1)
    b.replica(p, n, [0])
    change = model_resize(name="llama-3.1-8b", gpus=2, in_place=True)
    assert change.in_place is False and change.room.beside == ("gpu-1",)


def test_in_place_when_only_the_models_own_cards_make_room(actor):
    n = b.node("gpu-1", cards=4)
    p = b.profile(b.llama_8b(), "h100", gpus=2)
    b.replica(p, n, [0, 1])
    with pytest.raises(DomainError) as err:
        model_resize(name="llama-3.1-8b", gpus=4)
    assert err.value.code == "no_room_beside" and "Restarting in place" in err.value.message
    change = model_resize(name="llama-3.1-8b", gpus=4, in_place=True)
    assert change.in_place is True and change.room.in_place_nodes == ("gpu-1",)


def test_cordoned_and_down_nodes_offer_no_room(actor):
    b.node("gpu-c", cards=8, state="cordoned")
    b.node("gpu-d", cards=8, state="down")
    b.profile(b.llama_8b(), "h100", gpus=1)
    with pytest.raises(DomainError) as err:
        model_resize(name="llama-3.1-8b", gpus=2)
    assert (err.value.code, err.value.status) == ("no_class", 409)


# -- queries ----------------------------------------------------------------------------------------


def _nodes(count: int, start: int, cls) -> None:
    nodes = Node.objects.bulk_create(
        Node(name=f"bulk-{i:04d}", agent_url="http://127.0.0.1:9", agent_token="t")
        for i in range(start, count)
    )
    Card.objects.bulk_create(Card(node=n, index=i, gpu_class=cls) for n in nodes for i in range(8))


def test_a_dry_run_reads_the_same_number_of_queries_at_10_and_500_nodes():
    cls = b.gpu_class()
    m = b.llama_8b()
    p = b.profile(m, "h100", gpus=1)
    _nodes(10, 0, cls)
    b.replica(p, Node.objects.get(name="bulk-0000"), [0])
    actor = Actor(via="cli", name="pytest")

    with CaptureQueriesContext(connection) as at_10:
        small = model_resize(name=m.name, gpus=2, dry_run=True, actor=actor)
    _nodes(500, 10, cls)
    with CaptureQueriesContext(connection) as at_500:
        large = model_resize(name=m.name, gpus=2, dry_run=True, actor=actor)

    assert (len(small.room.beside), len(large.room.beside)) == (10, 500)  # every node was read
    # The model, its restart under way, its profiles, its running replicas, the classes, and the
    # fleet as four lists of ids (selectors.rooms_and_fleet): nine, at 10 nodes as at 500.
    assert (
        len(at_500.captured_queries) == len(at_10.captured_queries) <= 11
    )  # 10: the cards a foreign process holds (telemetry); 11: the fleet's default engine releases


# -- locks -------------------------------------------------------------------------------------------


def test_a_writer_lock_still_held_when_sqlite_stops_waiting_is_refused_as_busy(actor, monkeypatch):
    b.node("gpu-1", cards=8)
    b.profile(b.llama_8b(), "h100", gpus=1)

    def locked(*args, **kw):
        raise OperationalError("database is locked")

    monkeypatch.setattr("operations.services.resize._plan", locked)
    with pytest.raises(DomainError) as err:
        model_resize(name="llama-3.1-8b", gpus=2)
    assert (err.value.code, err.value.status) == ("busy", 409)
    assert "Another change to llama-3.1-8b" in err.value.message


def test_a_database_failure_that_is_not_a_lock_is_not_passed_off_as_busy(actor, monkeypatch):
    b.node("gpu-1", cards=8)
    b.profile(b.llama_8b(), "h100", gpus=1)

    def broken(*args, **kw):
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr("operations.services.resize._plan", broken)
    with pytest.raises(OperationalError, match="server closed"):
        model_resize(name="llama-3.1-8b", gpus=2)


def test_a_resize_starts_the_restart_of_the_replicas_it_made_stale_in_the_same_transaction(actor):
    from operations.models import RestartOperation
    from operations.services.resize import model_resize

    n = b.node("gpu-1", cards=8)
    p = b.profile(b.llama_8b(), "h100", gpus=1)
    r1 = b.replica(p, n, [0], name="llama-1", port=8001)
    r2 = b.replica(p, n, [1], name="llama-2", port=8002)
    change = model_resize(name="llama-3.1-8b", gpus=2)
    assert change.restarted == 2 and change.in_place is False
    op = RestartOperation.objects.get(pk=change.operation)
    assert (op.state, op.in_place, op.profile_id) == ("queued", False, p.pk)
    assert sorted(op.steps.values_list("old_replica__name", flat=True)) == [r1.name, r2.name]
    assert list(AuditEntry.objects.order_by("id").values_list("action", flat=True)) == [
        "resize",
        "restart_start",
    ]


def test_a_change_while_a_restart_runs_is_refused_as_busy_before_and_at_apply(actor):
    from operations.models import RestartOperation
    from operations.services.resize import model_resize

    n = b.node("gpu-1", cards=8)
    p = b.profile(b.llama_8b(), "h100", gpus=1)
    b.replica(p, n, [0], name="llama-1", port=8001)
    first = model_resize(name="llama-3.1-8b", gpus=2)
    entries = AuditEntry.objects.count()
    for dry_run in (True, False):
        with pytest.raises(DomainError) as err:
            model_resize(name="llama-3.1-8b", gpus=4, dry_run=dry_run)
        assert err.value.code == "busy" and err.value.status == 409
        assert f"Restart #{first.operation}" in err.value.message
    p.refresh_from_db()
    assert (p.tp, AuditEntry.objects.count(), RestartOperation.objects.count()) == (2, entries, 1)
