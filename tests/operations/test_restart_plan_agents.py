"""The whole restart played through in the dry run, on real agents: the issue's
two-replica in-place resize is refused naming the replica with no place, and
a resize that fits restarts every replica where the dry run said."""

from __future__ import annotations

import pytest

from audit.models import AuditEntry
from base.errors import DomainError
from catalog.models import Card, Profile, Replica
from operations.models import RestartOperation
from operations.services.resize import model_resize
from operations.services.runner import run_operation
from tests.support import builders as b
from tests.support.restart import MODEL, answers, assert_nothing_half_done, fleet_of

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("fast_restarts", "audit_flushable"),
]


def test_two_replicas_in_place_to_eight_cards_is_refused_naming_the_one_beside_another_model(tmp_path, actor):
    # llama on gpu-h1 beside another model and on gpu-h2; gpu-h1 has only 6
    # cards. Resized to 8 in place, gpu-h2's replica could restart on its own
    # node's 8, but gpu-h1's has no place: the dry run says so and refuses.
    with fleet_of(tmp_path, nodes=("gpu-h1", "gpu-h2"), cards=8) as fleet:
        Card.objects.filter(node__name="gpu-h1", index__gte=6).delete()
        first = fleet.start("llama-1", "gpu-h1", [0])
        fleet.start("llama-2", "gpu-h2", [0])
        other = b.profile(b.llama_8b("other-model"), "h100", cls=first.profile.gpu_class)
        b.replica(other, fleet.nodes["gpu-h1"], [1, 2, 3, 4], name="other-1", port=7999)
        profile_before = Profile.objects.get(pk=fleet.profile.pk)
        entries = AuditEntry.objects.count()

        for dry_run in (True, False):
            with pytest.raises(DomainError) as err:
                model_resize(name=MODEL, gpus=8, in_place=True, dry_run=dry_run)
            assert (err.value.code, err.value.status) == ("no_room", 409)
            assert err.value.message.startswith("llama-1 has no place"), err.value.message
            assert "gpu-h1 has only 2 with llama-1's own freed" in err.value.message
            assert err.value.change["after"] == 8

        # nothing saved: the profile, the audit log, no restart
        profile = Profile.objects.get(pk=fleet.profile.pk)
        assert (profile.gpus_per_node, profile.tp, profile.revision) == (
            profile_before.gpus_per_node,
            profile_before.tp,
            profile_before.revision,
        )
        assert AuditEntry.objects.count() == entries
        assert not RestartOperation.objects.exists()
        assert answers(first.port)


def test_a_resize_that_fits_restarts_every_replica_where_the_dry_run_said(tmp_path, actor):
    with fleet_of(tmp_path, nodes=("gpu-a", "gpu-b"), cards=4) as fleet:
        fleet.start("llama-1", "gpu-a", [0])
        fleet.start("llama-2", "gpu-b", [0])
        other = b.profile(b.llama_8b("other-model"), "h100", cls=fleet.profile.gpu_class)
        b.replica(other, fleet.nodes["gpu-a"], [1, 2], name="other-1", port=7999)

        preview = model_resize(name=MODEL, gpus=2, dry_run=True)
        planned = [(p.replica, p.node, p.cards, p.in_place) for p in preview.room.places]
        # llama-1 first: only gpu-b has 2 free; its old card on gpu-a then comes
        # free, so llama-2 (whose sibling now runs on gpu-b) goes to gpu-a 0, 3.
        assert planned == [("llama-1", "gpu-b", (1, 2), False), ("llama-2", "gpu-a", (0, 3), False)]
        assert "--tensor-parallel-size 2" in " ".join(preview.launch)

        change = model_resize(name=MODEL, gpus=2)
        assert [(p.replica, p.node, p.cards) for p in change.room.places] == [
            (r, n, c) for r, n, c, _ in planned
        ]
        assert run_operation(change.operation) == "succeeded"
        op = RestartOperation.objects.get(pk=change.operation)
        for step, (old, node, cards, _) in zip(op.steps.order_by("id"), planned, strict=True):
            assert step.old_replica.name == old
            assert (step.planned_node, step.planned_cards) == (node, list(cards))
            new = step.new_replica
            held = sorted((s.card.node.name, s.card.index) for s in new.shards.select_related("card__node"))
            assert held == [(node, i) for i in cards], (old, held)
            assert new.state == "ready" and answers(new.port)
        assert set(
            Replica.objects.filter(name__in=["llama-1", "llama-2"]).values_list("state", flat=True)
        ) == {"stopped"}
        assert_nothing_half_done()
