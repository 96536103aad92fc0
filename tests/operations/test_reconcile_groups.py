"""The reconciler treats a replica across nodes as one unit (operations/services/reconcile_groups.py),
against real agents and stand-in engines: a rank its agent no longer runs fails the whole replica
and every other rank is stopped; a group whose stop was not confirmed is stopped on every node,
each node's cards freed as its agent confirms; a group whose node did not answer is live again only
once every node of it answers.

Each rank here is a stand-in started on its node's agent under the replica's name, as a rank is,
without rank flags: these tests are about what the reconciler does with what the agents list. The
stand-in's own rendezvous (a rank lost takes its peers down) is exercised end to end in
tests/operations/test_restart_groups.py.
"""

from __future__ import annotations

import os
import signal
from datetime import timedelta

import pytest
from django.utils import timezone

from audit.models import AuditEntry
from catalog.models import Card, Node, Profile, Replica, Shard
from operations.models import RestartOperation, RestartStep
from operations.services.reconcile import reconcile
from operations.services.reconcile_groups import LOST, reconcile_group
from operations.services.specs import replica_spec
from tests.support.restart import Fleet, assert_catalog_is_what_agents_run, engines_on, fleet_of

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("fast_restarts", "audit_flushable"),
]


def recorded_group(fleet: Fleet, name: str, port: int) -> Replica:
    """A ready replica of two ranks, rank 0 on gpu-a card 0 and rank 1 on gpu-b card 0, each running
    on its node's agent under the replica's name."""
    profile = Profile.objects.select_related("model").get(pk=fleet.profile.pk)
    replica = Replica.objects.create(
        name=name,
        profile=profile,
        port=port,
        rendezvous_port=port + 1,
        state="ready",
        revision=profile.revision,
    )
    for rank, node in enumerate(("gpu-a", "gpu-b")):
        Shard.objects.create(replica=replica, card=Card.objects.get(node__name=node, index=0), rank=rank)
        # Each its own port: both agents are on 127.0.0.1, and these stand-ins play no headless rank.
        spec = replica_spec(profile, port=port + 2 * rank, cards=[0])
        with fleet.agents[node].client() as http:
            assert http.put(f"/v1/replicas/{name}", json=spec).status_code == 201
        fleet.agents[node].wait_for_state(name, "ready")
    # Recorded before the passes below are asked: they speak of it.
    Replica.objects.filter(pk=replica.pk).update(state_changed_at=timezone.now() - timedelta(seconds=5))
    return replica


def reconciler_entries(name: str) -> list[AuditEntry]:
    entries = list(AuditEntry.objects.filter(action="reconcile", object_key=name).order_by("id"))
    assert all((e.actor, e.via) == ("reconciler", "worker") for e in entries), entries
    return entries


def test_a_rank_its_agent_no_longer_runs_fails_the_whole_replica_and_stops_every_other_rank(
    tmp_path, actor, settings
):
    with fleet_of(tmp_path, nodes=("gpu-a", "gpu-b")) as fleet:
        group = recorded_group(fleet, "llama-9", port=settings.LLMGW_REPLICA_PORT_BASE)
        pid = fleet.agents["gpu-b"].replica("llama-9")["pid"]
        os.killpg(pid, signal.SIGKILL)  # rank 1 dies; rank 0 (here) keeps running and answering
        fleet.agents["gpu-b"].wait_for_state("llama-9", "failed")

        reconcile()

        group.refresh_from_db()
        assert group.state == "failed", group.reason
        assert group.reason.startswith(f"{LOST}rank 1 on gpu-b: "), group.reason
        assert not Shard.objects.filter(replica=group).exists()
        assert "llama-9" not in engines_on(fleet.agents["gpu-a"])  # rank 0 stopped on its agent
        said = [e.message for e in reconciler_entries("llama-9")]
        assert said[0].startswith("llama-9: ready → stopping (a rank was lost: rank 1 on gpu-b"), said
        assert any("rank 1 on gpu-b" in m and "cards gpu-b#0 freed" in m for m in said), said
        assert any("rank 0 on gpu-a" in m and "every rank is gone: failed" in m for m in said), said
        assert_catalog_is_what_agents_run(fleet)


def test_a_group_left_stopping_is_stopped_on_every_node_and_ends_with_its_last_card(
    tmp_path, actor, settings
):
    with fleet_of(tmp_path, nodes=("gpu-a", "gpu-b")) as fleet:
        group = recorded_group(fleet, "llama-9", port=settings.LLMGW_REPLICA_PORT_BASE)
        Replica.objects.filter(pk=group.pk).update(state="stopping", reason="its stop was not confirmed")

        reconcile()

        group.refresh_from_db()
        assert group.state == "stopped" and not Shard.objects.filter(replica=group).exists()
        for agent in fleet.agents.values():
            assert "llama-9" not in engines_on(agent)
        assert len(reconciler_entries("llama-9")) == 2  # one node's cards at a time
        assert_catalog_is_what_agents_run(fleet)


def test_a_group_whose_node_did_not_answer_is_ready_again_only_once_every_node_answers(
    tmp_path, actor, settings
):
    with fleet_of(tmp_path, nodes=("gpu-a", "gpu-b")) as fleet:
        group = recorded_group(fleet, "llama-9", port=settings.LLMGW_REPLICA_PORT_BASE)
        url = fleet.nodes["gpu-b"].agent_url
        Node.objects.filter(name="gpu-b").update(agent_url="http://127.0.0.1:9")  # nothing listens

        reconcile()
        group.refresh_from_db()
        assert group.state == "unknown" and "does not answer" in group.reason
        assert Shard.objects.filter(replica=group).count() == 2  # it may run: its cards are kept

        # gpu-b answers again: once both nodes answer, rank 0's state is the group's.
        Node.objects.filter(name="gpu-b").update(agent_url=url)
        for _ in range(2):  # a pass may apply gpu-a's listing before gpu-b is known to answer
            reconcile()
        group.refresh_from_db()
        assert group.state == "ready", group.reason
        assert Shard.objects.filter(replica=group).count() == 2
        assert_catalog_is_what_agents_run(fleet)


def test_a_lost_group_left_holding_rank_0_alone_still_ends_failed_when_rank_0_stops(
    tmp_path, actor, settings
):
    # A pass that lost rank 1 freed gpu-b's card but could not stop rank 0 (its agent did not
    # confirm): the group is left stopping with rank 0's card alone. It is still a group, not a
    # one-node replica: the pass that stops rank 0 ends it failed, with why it was lost kept.
    with fleet_of(tmp_path, nodes=("gpu-a", "gpu-b")) as fleet:
        group = recorded_group(fleet, "llama-9", port=settings.LLMGW_REPLICA_PORT_BASE)
        with fleet.agents["gpu-b"].client() as http:
            assert http.delete("/v1/replicas/llama-9").status_code in (200, 202, 204)
        lost = f"{LOST}rank 1 on gpu-b: the agent does not run it"
        Shard.objects.filter(replica=group, rank=1).delete()
        Replica.objects.filter(pk=group.pk).update(state="stopping", reason=lost)

        reconcile()

        group.refresh_from_db()
        assert group.state == "failed", (group.state, group.reason)
        assert group.reason == lost
        assert not Shard.objects.filter(replica=group).exists()
        assert "llama-9" not in engines_on(fleet.agents["gpu-a"])
        assert_catalog_is_what_agents_run(fleet)


def test_a_group_a_restart_took_after_the_pass_began_is_left_to_the_restart(tmp_path, actor, settings):
    # The pass read which replicas operations own before a step took this one (as _set_state
    # guards a one-node replica under its row lock): the runner now records it, not the reconciler.
    with fleet_of(tmp_path, nodes=("gpu-a", "gpu-b")) as fleet:
        group = recorded_group(fleet, "llama-9", port=settings.LLMGW_REPLICA_PORT_BASE)
        pid = fleet.agents["gpu-b"].replica("llama-9")["pid"]
        os.killpg(pid, signal.SIGKILL)
        theirs = fleet.agents["gpu-b"].wait_for_state("llama-9", "failed")
        fence = timezone.now()
        op = RestartOperation.objects.create(
            model=group.profile.model, profile=group.profile, state="running"
        )
        RestartStep.objects.create(operation=op, old_replica=group, state="starting")

        said = reconcile_group(group, Node.objects.get(name="gpu-b"), theirs, actor=actor, fence=fence)

        assert said == []
        group.refresh_from_db()
        assert group.state == "ready"
        assert Shard.objects.filter(replica=group).count() == 2
        assert "llama-9" in engines_on(fleet.agents["gpu-a"])  # rank 0 not stopped behind the runner's back
        assert not AuditEntry.objects.filter(action="reconcile", object_key="llama-9").exists()


def test_a_group_unknown_is_not_live_again_while_another_rank_is_not_running(tmp_path, actor, settings):
    # gpu-b answers again but no longer runs rank 1 (its node rebooted, say): rank 0's node's pass
    # must not record the group ready, as every node answers, while rank 1 does not run.
    with fleet_of(tmp_path, nodes=("gpu-a", "gpu-b")) as fleet:
        group = recorded_group(fleet, "llama-9", port=settings.LLMGW_REPLICA_PORT_BASE)
        with fleet.agents["gpu-b"].client() as http:
            assert http.delete("/v1/replicas/llama-9").status_code in (200, 202, 204)
        Replica.objects.filter(pk=group.pk).update(
            state="unknown",
            reason="its node's agent does not answer",
            state_changed_at=timezone.now() - timedelta(seconds=5),
        )
        group.refresh_from_db()
        theirs = engines_on(fleet.agents["gpu-a"])["llama-9"]

        said = reconcile_group(
            group, Node.objects.get(name="gpu-a"), theirs, actor=actor, fence=timezone.now()
        )

        group.refresh_from_db()
        assert group.state == "unknown" and said == [], (said, group.reason)

        reconcile()  # gpu-b's pass: its rank is gone, so the whole group fails

        group.refresh_from_db()
        assert group.state == "failed" and group.reason.startswith(f"{LOST}rank 1 on gpu-b"), group.reason
        assert "llama-9" not in engines_on(fleet.agents["gpu-a"])
        assert_catalog_is_what_agents_run(fleet)
