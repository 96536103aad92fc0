"""Replicas across nodes, end to end: real agents (one process per node, all on 127.0.0.1), the
stand-in engine playing ranks with a real rendezvous (rank 0 waits for the others to join, a rank
lost takes the group down), real ``db_worker`` processes on PostgreSQL. Each test ends comparing
the catalog with what every agent runs (``catalog_differences``, node by node).

A two-node profile (two ranks of two cards each) is planned and started by a restart of a one-node
replica, ready only once rank 0 serves and rank 1 is alive; restarted rolling while two whole
nodes are free and in place once none is; one rank killed fails the replica and leaves no rank
running; a drain of one of its nodes moves the whole group.
"""

from __future__ import annotations

import contextlib
import os
import signal

import pytest
from agent_testing import wait_until

from audit.models import AuditEntry
from catalog.models import Node, Replica, Shard
from operations.api.views import RestartStepSerializer
from operations.models import RestartOperation, RestartStep
from operations.services.drain import node_drain, node_drain_plan
from operations.services.start import operation_cancel, restart_start
from tests.support import builders as b
from tests.support.restart import (
    MODEL,
    Fleet,
    answers,
    assert_catalog_is_what_agents_run,
    assert_nothing_half_done,
    catalog_differences,
    db_worker,
    engines_on,
    fleet_of,
    wait_for_operation,
)
from tests.web.pages_support import signed_in

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("fast_restarts", "audit_flushable"),
]

NODES = ("gpu-a", "gpu-b", "gpu-c", "gpu-d")
FABRIC = "ib-test-1"
# Two ranks of two cards: vLLM's way, TP within a node (2), PP across the nodes (2).
GROUP = {"gpus_per_node": 2, "tp": 2, "nodes": 2, "pp": 2}


@contextlib.contextmanager
def group_fleet(tmp_path, **kwargs):
    """Four nodes of two cards in one fabric domain, each its own agent process; the model's one-card
    replica ready on gpu-a."""
    with fleet_of(tmp_path, NODES, cards=2, processes=True, **kwargs) as fleet:
        Node.objects.filter(name__in=NODES).update(fabric_domain=FABRIC)
        fleet.start("llama-1", "gpu-a", [0])
        yield fleet


def ranks_of(replica: Replica) -> list[tuple[int, str, list[int]]]:
    by_rank: dict[int, tuple[str, list[int]]] = {}
    for shard in (
        Shard.objects.filter(replica=replica).select_related("card__node").order_by("rank", "card__index")
    ):
        by_rank.setdefault(shard.rank, (shard.card.node.name, []))[1].append(shard.card.index)
    return [(rank, node, cards) for rank, (node, cards) in sorted(by_rank.items())]


def in_line(fleet: Fleet, timeout: float = 30) -> None:
    """Wait until the reconciler has brought the catalog in line with the agents, then check it is."""
    with contextlib.suppress(TimeoutError):  # said below, with the differences
        wait_until(
            lambda: not catalog_differences(fleet), timeout=timeout, interval=0.3, what="the catalog in line"
        )
    assert_catalog_is_what_agents_run(fleet)


def running_ranks(fleet: Fleet, name: str) -> dict[str, dict]:
    """Where the agents run ``name``: node to its entry (live states only)."""
    return {node: on[name] for node, agent in fleet.agents.items() if name in (on := engines_on(agent))}


def why(op: RestartOperation, worker) -> tuple:
    """What a restart that did not succeed said: the operation's summary cuts each step's reason short,
    so each step's reason whole (which of a start's causes it was: token, refusal, port, agent away)."""
    return (op.reason, [(s.pk, s.state, s.reason) for s in op.steps.order_by("pk")], worker.output())


def only_step(op: RestartOperation) -> RestartStep:
    (step,) = op.steps.select_related("old_replica", "new_replica")
    return step


def assert_group_serves(fleet: Fleet, replica: Replica) -> None:
    """Ready in the catalog, rank 0 answering on its port, every rank live on its own node's agent with
    the cards the catalog says, each spec naming rank 0's address and the rendezvous port."""
    replica.refresh_from_db()
    assert replica.state == "ready", replica.reason
    ranks = ranks_of(replica)
    assert [r for r, _, _ in ranks] == [0, 1] and len({node for _, node, _ in ranks}) == 2, ranks
    running = running_ranks(fleet, replica.name)
    assert sorted(running) == sorted(node for _, node, _ in ranks), running
    for rank, node, cards in ranks:
        entry = running[node]
        assert entry["state"] == "ready", entry
        assert sorted(entry["cards"]) == cards
        assert entry["group"] == {
            "rank": rank,
            "size": 2,
            "address": "127.0.0.1",
            "port": replica.rendezvous_port,
        }, entry
    assert answers(replica.port)


def test_a_two_node_profile_is_planned_started_ready_then_restarted_rolling_and_in_place(
    tmp_path, actor, settings
):
    with group_fleet(tmp_path) as fleet:
        fleet.change_profile(**GROUP)
        with db_worker(tmp_path, "worker-a", port_base=settings.LLMGW_REPLICA_PORT_BASE) as worker:
            # Planned across two whole free nodes (gpu-a holds llama-1), started, ready: the old one stops.
            op = wait_for_operation(restart_start(model_name=MODEL, ready_timeout=60).pk, timeout=120)
            assert op.state == "succeeded", why(op, worker)
            step = only_step(op)
            assert not step.in_place and len(step.planned_ranks) == 2, step.planned_ranks
            group = step.new_replica
            assert_group_serves(fleet, group)
            assert [(r["rank"], r["node"], r["cards"]) for r in step.planned_ranks] == ranks_of(group)
            assert {r["state"] for r in step.ranks} == {"ready"}, step.ranks  # the page's rank states
            page = signed_in(b.user("viewer")).get(f"/operations/{op.pk}/").content.decode()
            for rank, node, _ in ranks_of(group):
                assert f'rank {rank} on <a href="/nodes/{node}/">{node}</a>' in page, page
            listed = RestartStepSerializer(step).data["ranks"]
            assert [(r["rank"], r["node"], r["state"]) for r in listed] == [
                (rank, node, "ready") for rank, node, _ in ranks_of(group)
            ]
            assert all("spec" not in r for r in listed)  # the specs (their environment) are not shown
            assert Replica.objects.get(name="llama-1").state == "stopped"
            in_line(fleet)

            # Rolling while two whole nodes are free: the new group is ready before the old one stops.
            fleet.change_profile(env={"STANDIN_LOAD_SECONDS": "0.4"})
            op = wait_for_operation(restart_start(model_name=MODEL, ready_timeout=60).pk, timeout=120)
            assert op.state == "succeeded", why(op, worker)
            step = only_step(op)
            assert not step.in_place
            rolled = step.new_replica
            assert_group_serves(fleet, rolled)
            assert {n for _, n, _ in ranks_of(rolled)}.isdisjoint({r["node"] for r in step.old_ranks})
            group.refresh_from_db()
            assert group.state == "stopped" and not running_ranks(fleet, group.name)
            in_line(fleet)

            # No two whole nodes free (one card taken on each free node): in place, every rank stopped first.
            rolled_ranks = ranks_of(rolled)
            free_nodes = sorted(set(NODES) - {n for _, n, _ in rolled_ranks})
            for i, node in enumerate(free_nodes):
                fleet.start(f"blocker-{i}", node, [1], port=settings.LLMGW_REPLICA_PORT_BASE - 20 + i)
            fleet.change_profile(env={"STANDIN_LOAD_SECONDS": "0.3"})
            op = restart_start(model_name=MODEL, replicas=[rolled.name], ready_timeout=60)
            op = wait_for_operation(op.pk, timeout=120)
            assert op.state == "succeeded", why(op, worker)
            step = only_step(op)
            assert step.in_place, step.reason
            in_place = step.new_replica
            assert_group_serves(fleet, in_place)
            # The old group's very cards, rank for rank, and its ports.
            assert ranks_of(in_place) == [(r["rank"], r["node"], r["cards"]) for r in step.old_ranks]
            assert ranks_of(in_place) == rolled_ranks
            assert (in_place.port, in_place.rendezvous_port) == (rolled.port, rolled.rendezvous_port)
            rolled.refresh_from_db()
            assert rolled.state == "stopped"
            # Every rank of the old group was stopped before the new one started: its stop entries first.
            entries = list(
                AuditEntry.objects.filter(object_key__in=[rolled.name, in_place.name]).order_by("id")
            )
            stopped_at = next(
                i for i, e in enumerate(entries) if e.object_key == rolled.name and e.action == "stop"
            )
            started_at = next(
                i for i, e in enumerate(entries) if e.object_key == in_place.name and e.action == "start"
            )
            assert stopped_at < started_at
            # Its stop entry frees every rank's cards, not rank 0's alone.
            held = sorted(f"{node}#{i}" for _, node, cards in rolled_ranks for i in cards)
            assert sorted(entries[stopped_at].before["cards"]) == held, entries[stopped_at].before
            in_line(fleet)
        assert_nothing_half_done()


def test_one_rank_killed_fails_the_whole_replica_and_leaves_no_rank_running(tmp_path, actor, settings):
    with group_fleet(tmp_path) as fleet:
        fleet.change_profile(**GROUP)
        with db_worker(tmp_path, "worker-a", port_base=settings.LLMGW_REPLICA_PORT_BASE) as worker:
            op = wait_for_operation(restart_start(model_name=MODEL, ready_timeout=60).pk, timeout=120)
            assert op.state == "succeeded", why(op, worker)
            group = only_step(op).new_replica
            assert_group_serves(fleet, group)
            (_, rank1_node, _) = ranks_of(group)[1]
            pid = fleet.agents[rank1_node].replica(group.name)["pid"]
            os.killpg(pid, signal.SIGKILL)  # rank 1's engine dies; rank 0's /health may still answer

            def failed() -> Replica | None:
                row = Replica.objects.get(pk=group.pk)
                return row if row.state == "failed" else None

            row = wait_until(failed, timeout=30, interval=0.2, what=f"{group.name} failed in the catalog")
        assert row.reason.startswith("a rank was lost: rank "), row.reason
        assert not Shard.objects.filter(replica=row).exists()  # every agent said nothing of it runs
        assert not running_ranks(fleet, group.name)
        entries = AuditEntry.objects.filter(object_key=group.name, action="reconcile")
        assert entries.exists() and {e.actor for e in entries} == {"reconciler"}
        in_line(fleet)


def test_a_rank_lost_while_the_group_starts_fails_the_step_stops_every_rank_and_the_old_one_serves(
    tmp_path, actor, settings
):
    with group_fleet(tmp_path) as fleet:
        fleet.change_profile(env={"STANDIN_LOAD_SECONDS": "4"}, **GROUP)
        with db_worker(tmp_path, "worker-a", port_base=settings.LLMGW_REPLICA_PORT_BASE) as worker:
            op = restart_start(model_name=MODEL, ready_timeout=60)
            step = wait_until(
                lambda: RestartStep.objects.filter(operation=op, state="waiting").first(),
                timeout=60,
                interval=0.1,
                what="the group loading",
            )
            new = Replica.objects.get(pk=step.new_replica_id)
            (_, rank1_node, _) = ranks_of(new)[1]
            pid = wait_until(
                lambda: fleet.agents[rank1_node].replica(new.name).get("pid"),
                timeout=20,
                what="rank 1's process",
            )
            os.killpg(pid, signal.SIGKILL)
            op = wait_for_operation(op.pk, timeout=120)
        assert op.state == "failed", (op.reason, worker.output())
        step = only_step(op)
        assert f"rank 1 of {new.name}" in step.reason or "rank 0 of" in step.reason, step.reason
        assert "llama-1 keeps serving" in step.reason, step.reason
        new.refresh_from_db()
        assert new.state == "failed" and not new.shards.exists()
        assert not running_ranks(fleet, new.name)
        old = Replica.objects.get(name="llama-1")
        assert old.state == "ready" and answers(old.port)
        in_line(fleet)
        assert_nothing_half_done()


def test_a_drain_of_a_node_holding_one_rank_moves_the_whole_group(tmp_path, actor, settings):
    with group_fleet(tmp_path) as fleet:
        fleet.change_profile(**GROUP)
        with db_worker(tmp_path, "worker-a", port_base=settings.LLMGW_REPLICA_PORT_BASE) as worker:
            op = wait_for_operation(restart_start(model_name=MODEL, ready_timeout=60).pk, timeout=120)
            assert op.state == "succeeded", why(op, worker)
            group = only_step(op).new_replica
            assert_group_serves(fleet, group)
            (_, rank1_node, _) = ranks_of(group)[1]

            # Played through first: the whole group goes, every rank, and none to the drained node.
            (move,) = node_drain_plan(node_name=rank1_node)
            assert [(r["rank"], r["node"], r["cards"]) for r in move.from_ranks] == ranks_of(group)
            assert len(move.to_ranks) == 2 and rank1_node not in {r["node"] for r in move.to_ranks}
            assert move.text.startswith(f"{group.name} ({MODEL}, ready): rank 0 on "), move.text

            (drain,) = node_drain(node_name=rank1_node, ready_timeout=60)
            drain = wait_for_operation(drain.pk, timeout=120)
            assert drain.state == "succeeded", (drain.reason, worker.output())
            moved = only_step(drain).new_replica
            assert_group_serves(fleet, moved)
            assert rank1_node not in {n for _, n, _ in ranks_of(moved)}
            group.refresh_from_db()
            # The whole old group stopped, on both its nodes, not only the drained one's rank.
            assert group.state == "stopped" and not group.shards.exists()
            assert not running_ranks(fleet, group.name)
            assert Node.objects.get(name=rank1_node).state == "cordoned"
            in_line(fleet)
        assert_nothing_half_done()


def test_a_cancel_while_the_group_starts_stops_every_rank_it_started(tmp_path, actor, settings):
    with group_fleet(tmp_path) as fleet:
        fleet.change_profile(env={"STANDIN_LOAD_SECONDS": "8"}, **GROUP)
        with db_worker(tmp_path, "worker-a", port_base=settings.LLMGW_REPLICA_PORT_BASE) as worker:
            op = restart_start(model_name=MODEL, ready_timeout=60)
            step = wait_until(
                lambda: RestartStep.objects.filter(operation=op, state="waiting").first(),
                timeout=60,
                interval=0.1,
                what="the group loading",
            )
            new = Replica.objects.get(pk=step.new_replica_id)
            wait_until(
                lambda: len(running_ranks(fleet, new.name)) == 2, timeout=20, what="both ranks running"
            )
            operation_cancel(operation_id=op.pk)
            op = wait_for_operation(op.pk, timeout=60)
        assert op.state == "cancelled", (op.reason, worker.output())
        step = only_step(op)
        assert step.state == "cancelled" and "cancelled while" in step.reason, step.reason
        new.refresh_from_db()
        assert new.state == "stopped" and "cancelled while" in new.reason and not new.shards.exists()
        assert not running_ranks(fleet, new.name)  # every rank it started, stopped
        old = Replica.objects.get(name="llama-1")
        assert old.state == "ready" and answers(old.port)
        in_line(fleet)
        assert_nothing_half_done()


def test_a_group_restarted_in_place_that_never_serves_is_stopped_and_the_old_group_started_again(
    tmp_path, actor, settings
):
    with group_fleet(tmp_path) as fleet:
        fleet.change_profile(**GROUP)
        with db_worker(tmp_path, "worker-a", port_base=settings.LLMGW_REPLICA_PORT_BASE) as worker:
            op = wait_for_operation(restart_start(model_name=MODEL, ready_timeout=60).pk, timeout=120)
            assert op.state == "succeeded", why(op, worker)
            group = only_step(op).new_replica
            before = ranks_of(group)
            for i, node in enumerate(sorted(set(NODES) - {n for _, n, _ in before})):
                fleet.start(f"blocker-{i}", node, [1], port=settings.LLMGW_REPLICA_PORT_BASE - 20 + i)
            # Rank 0 answers /health but cannot generate: never ready (docs/restarts.md, readiness).
            fleet.change_profile(env={"STANDIN_LOAD_SECONDS": "0.3", "STANDIN_GENERATION_FAILS": "1"})
            op = restart_start(model_name=MODEL, replicas=[group.name], ready_timeout=6)
            op = wait_for_operation(op.pk, timeout=120)
        assert op.state == "failed", (op.reason, worker.output())
        step = only_step(op)
        assert step.in_place
        assert (
            f"{group.name} was started again with its previous specs, every rank, and is ready" in step.reason
        )
        assert "was not ready within 6 s" in step.reason, step.reason
        step.new_replica.refresh_from_db()
        assert step.new_replica.state == "failed" and not running_ranks(fleet, step.new_replica.name)
        assert ranks_of(group) == before  # on its own cards again, rank for rank
        assert_group_serves(fleet, group)
        in_line(fleet)
        assert_nothing_half_done()


def test_a_rollback_adopts_a_group_that_runs_the_restored_settings(tmp_path, actor, settings):
    # The spec on record for a group is rank 0's, rank flags and the group's TP width included: the
    # restored settings' spec must be built as the same rank's to be compared with it.
    from rest_framework.test import APIClient

    from operations.services.rollback import plan_lines, profile_rollback
    from tests.support import builders as b

    with group_fleet(tmp_path) as fleet:
        fleet.change_profile(**GROUP)
        with db_worker(tmp_path, "worker-a", port_base=settings.LLMGW_REPLICA_PORT_BASE) as worker:
            op = wait_for_operation(restart_start(model_name=MODEL, ready_timeout=60).pk, timeout=120)
            assert op.state == "succeeded", why(op, worker)
        group = only_step(op).new_replica
        at = fleet.change_profile(args=["--max-num-seqs", "4"]).revision - 1
        done = profile_rollback(model=MODEL, profile=fleet.profile.name, revision=at, dry_run=True)
        assert [a.replica for a in done.adopted] == [group.name], done.restarted
        # Settings the group does not run: it is restarted, and the plan says where every rank goes.
        other = fleet.change_profile(args=["--max-num-seqs", "8"]).revision - 1
        done = profile_rollback(model=MODEL, profile=fleet.profile.name, revision=other, dry_run=True)
        (restarted,) = done.restarted
        assert restarted.replica == group.name and [r[0] for r in restarted.ranks] == [0, 1], restarted
        assert len({node for _, node, _ in restarted.ranks}) == 2
        assert (restarted.node, restarted.cards) == restarted.ranks[0][1:]
        (line,) = plan_lines(done)
        for rank, node, cards in restarted.ranks:
            assert f"rank {rank} on {node} card(s) {', '.join(map(str, cards))}" in line, line
        api = APIClient()
        api.force_authenticate(b.user("operator", "catalog.resize_model"))
        body = {"profile": fleet.profile.name, "revision": other, "dry_run": True}
        (said,) = api.post(f"/api/models/{MODEL}/rollback/", body, format="json").json()["restarted"]
        assert said["ranks"] == [{"rank": k, "node": n, "cards": list(c)} for k, n, c in restarted.ranks]


def test_a_cancel_while_a_group_starts_in_place_starts_the_old_group_again(tmp_path, actor, settings):
    # In place, the old group was stopped for the new one: a cancel stops the new group's ranks and
    # the old group is started again, its own start not taken for the cancelled one.
    with group_fleet(tmp_path) as fleet:
        fleet.change_profile(**GROUP)
        with db_worker(tmp_path, "worker-a", port_base=settings.LLMGW_REPLICA_PORT_BASE) as worker:
            op = wait_for_operation(restart_start(model_name=MODEL, ready_timeout=60).pk, timeout=120)
            assert op.state == "succeeded", why(op, worker)
            group = only_step(op).new_replica
            before = ranks_of(group)
            for i, node in enumerate(sorted(set(NODES) - {n for _, n, _ in before})):
                fleet.start(f"blocker-{i}", node, [1], port=settings.LLMGW_REPLICA_PORT_BASE - 20 + i)
            fleet.change_profile(env={"STANDIN_LOAD_SECONDS": "8"})
            op = restart_start(model_name=MODEL, replicas=[group.name], ready_timeout=60)
            step = wait_until(
                lambda: RestartStep.objects.filter(operation=op, state="waiting", in_place=True).first(),
                timeout=60,
                interval=0.1,
                what="the new group loading in place",
            )
            new = Replica.objects.get(pk=step.new_replica_id)
            wait_until(
                lambda: len(running_ranks(fleet, new.name)) == 2, timeout=20, what="both ranks running"
            )
            operation_cancel(operation_id=op.pk)
            op = wait_for_operation(op.pk, timeout=90)
        step = only_step(op)
        assert f"{group.name} was started again with its previous specs" in step.reason, (
            step.reason,
            worker.output(),
        )
        # Nothing failed: the cancel stopped the new group and the old one serves again.
        assert (step.state, op.state) == ("cancelled", "cancelled"), (step.state, op.state, op.reason)
        new.refresh_from_db()
        assert new.state == "stopped" and not running_ranks(fleet, new.name)
        assert ranks_of(group) == before
        assert_group_serves(fleet, group)
        in_line(fleet)
        assert_nothing_half_done()
