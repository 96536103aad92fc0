"""Running a restart against real agents and stand-in engines on 127.0.0.1.

The operation runs in this test process (``run_operation``): the point here is
what a run does to the replicas, their cards and the audit log. Workers as
processes are tests/operations/test_worker.py's.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime

import pytest
from django.db import connection, transaction

from audit.models import AuditEntry
from audit.services import verify_chain
from base.errors import DomainError
from catalog.models import Replica, Shard
from operations.models import RestartOperation, RestartStep
from operations.services.runner import run_operation
from operations.services.start import restart_start
from tests.support import builders as b
from tests.support.restart import (
    MODEL,
    answers,
    assert_nothing_half_done,
    fleet_of,
    sampling_ready,
)

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("fast_restarts", "audit_flushable"),
]


def steps_of(op: RestartOperation) -> list[RestartStep]:
    return list(op.steps.select_related("old_replica", "new_replica").order_by("id"))


def test_a_rolling_restart_replaces_every_replica_and_never_has_fewer_ready(tmp_path, actor):
    with fleet_of(tmp_path) as fleet:
        old = [
            fleet.start("llama-1", "gpu-a", [0]),
            fleet.start("llama-2", "gpu-a", [1]),
            fleet.start("llama-3", "gpu-b", [0]),
        ]
        profile = fleet.change_profile(args=["--max-num-seqs", "8"])
        op = restart_start(model_name=MODEL, max_parallel=2, ready_timeout=30)
        with sampling_ready(fleet) as samples:
            assert run_operation(op.pk) == "succeeded"

        assert samples and min(samples) >= 3, samples  # never below where it started
        assert max(samples) >= 4  # a replacement was ready before its old replica stopped
        op.refresh_from_db()
        assert (op.state, op.finished_at is not None, op.worker.startswith("worker:")) == (
            "succeeded",
            True,
            True,
        )
        assert op.reason.startswith("3 of 3 replica(s) restarted")
        for step in steps_of(op):
            assert step.state == "succeeded" and not step.in_place, step.reason
            new = step.new_replica
            assert (new.state, new.revision) == ("ready", profile.revision)
            assert answers(new.port)
            assert set(Shard.objects.filter(replica=new).values_list("card__node__name", "card__index")) == {
                (step.node, step.cards[0])
            }
            state = fleet.agents[step.node].replica(new.name)
            assert "--max-num-seqs" in state["args"]
        for replica in old:
            replica.refresh_from_db()
            assert replica.state == "stopped" and not replica.shards.exists()
        assert (
            fleet.ready_on_agents() == {"gpu-a": 2, "gpu-b": 1} or sum(fleet.ready_on_agents().values()) == 3
        )
        assert_nothing_half_done()

    # Audited by the worker, naming the operator who asked.
    entries = AuditEntry.objects.filter(via="worker")
    assert {e.action for e in entries} >= {"start", "ready", "stop", "restart_finish"}
    assert all("asked by pytest" in e.message for e in entries)
    assert AuditEntry.objects.get(action="restart_start").actor == "pytest"
    assert (
        AuditEntry.objects.filter(action="stop", object_key__in=["llama-1", "llama-2", "llama-3"]).count()
        == 3
    )
    assert verify_chain() == []


def test_best_fit_puts_the_replacement_on_the_node_with_the_fewest_free_cards_that_fit(tmp_path, actor):
    with fleet_of(tmp_path) as fleet:
        fleet.start("llama-1", "gpu-b", [0])
        # Another model's replica (recorded only: placement is the catalog's business) fills gpu-b further.
        b.replica(b.profile(b.llama_8b("filler")), fleet.nodes["gpu-b"], [1, 2], name="filler-1", port=8999)
        fleet.change_profile(args=["--max-num-seqs", "8"])
        op = restart_start(model_name=MODEL, replicas=["llama-1"], ready_timeout=30)
        assert run_operation(op.pk) == "succeeded"
        (step,) = steps_of(op)
        # gpu-b has 1 free card, gpu-a 4: gpu-b is the tighter fit.
        assert (step.node, step.cards) == ("gpu-b", [3])


def test_the_replacement_goes_where_the_models_other_replicas_are_not_even_if_that_fits_less_tightly(
    tmp_path, actor
):
    with fleet_of(tmp_path) as fleet:
        fleet.start("llama-1", "gpu-b", [0])
        fleet.start("llama-2", "gpu-b", [1])
        fleet.start("llama-3", "gpu-b", [2])
        fleet.change_profile(args=["--max-num-seqs", "8"])
        op = restart_start(model_name=MODEL, replicas=["llama-1"], ready_timeout=30)
        assert run_operation(op.pk) == "succeeded"
        (step,) = steps_of(op)
        # gpu-b is the tighter fit, but llama-2 and llama-3 run there: one node down would take all three.
        assert (step.node, step.cards) == ("gpu-a", [0])


def test_an_in_place_restart_stops_first_then_starts_on_the_same_cards_and_port(tmp_path, actor):
    with fleet_of(tmp_path) as fleet:
        old = fleet.start("llama-1", "gpu-a", [2])
        fleet.change_profile(args=["--max-num-seqs", "8"])
        op = restart_start(model_name=MODEL, in_place=True, ready_timeout=30)
        assert run_operation(op.pk) == "succeeded"
        (step,) = steps_of(op)
        assert (step.state, step.in_place, step.node, step.cards) == ("succeeded", True, "gpu-a", [2])
        old.refresh_from_db()
        new = step.new_replica
        assert old.state == "stopped" and fleet.agents["gpu-a"].replica("llama-1")["state"] == "stopped"
        assert (new.state, new.port) == ("ready", old.port) and answers(new.port)
        assert list(new.shards.values_list("card__index", flat=True)) == [2]
        assert_nothing_half_done()


def test_with_no_room_beside_the_restart_goes_in_place(tmp_path, actor):
    with fleet_of(tmp_path, nodes=("gpu-a",), cards=1) as fleet:
        fleet.start("llama-1", "gpu-a", [0])
        fleet.change_profile(args=["--max-num-seqs", "8"])
        op = restart_start(model_name=MODEL, ready_timeout=30)
        assert run_operation(op.pk) == "succeeded"
        (step,) = steps_of(op)
        assert step.in_place and step.cards == [0]


def test_rolling_only_without_room_is_refused_before_it_starts_and_changes_nothing(tmp_path, actor):
    # The whole restart is played through when it is asked for: with no room
    # beside llama-1 and in place not allowed, it is refused naming the replica.
    with fleet_of(tmp_path, nodes=("gpu-a",), cards=1) as fleet:
        old = fleet.start("llama-1", "gpu-a", [0])
        fleet.change_profile(args=["--max-num-seqs", "8"])
        with pytest.raises(DomainError) as err:
            restart_start(model_name=MODEL, in_place=False, ready_timeout=30)
        assert err.value.code == "no_room_beside" and err.value.status == 409
        assert (
            "llama-1 has no place" in err.value.message and "beside the running replicas" in err.value.message
        )
        assert not RestartOperation.objects.exists()
        old.refresh_from_db()
        assert old.state == "ready" and answers(old.port)
        assert_nothing_half_done()


def test_a_step_whose_planned_cards_were_taken_fails_saying_so_and_changes_nothing(tmp_path, actor):
    # Planned with room beside (gpu-a card 1); before the worker runs, another
    # model's replica takes that card: the step follows the plan, finds the
    # fleet changed, and fails without touching llama-1.
    with fleet_of(tmp_path, nodes=("gpu-a",), cards=2) as fleet:
        old = fleet.start("llama-1", "gpu-a", [0])
        fleet.change_profile(args=["--max-num-seqs", "8"])
        op = restart_start(model_name=MODEL, in_place=False, ready_timeout=30)
        (step,) = steps_of(op)
        assert (step.planned_node, step.planned_cards, step.planned_in_place) == ("gpu-a", [1], False)
        other = b.profile(b.llama_8b("other-model"), "h100", cls=old.profile.gpu_class)
        b.replica(other, old.shards.get().card.node, [1], name="other-1")
        assert run_operation(op.pk) == "failed"
        (step,) = steps_of(op)
        assert "The fleet changed since the restart was planned" in step.reason, step.reason
        assert "gpu-a cards 1" in step.reason and "llama-1 keeps serving" in step.reason
        old.refresh_from_db()
        assert old.state == "ready" and answers(old.port)


@pytest.mark.postgres  # steps run in threads only where connections can share the database
def test_a_parallel_step_whose_planned_cards_are_still_held_lets_a_later_step_go_first(tmp_path, actor):
    # Two nodes of three cards, four replicas, one card free on each. At two at a time the plan puts
    # llama-1 and llama-2 on the free cards, then llama-3 on the card llama-1 frees and llama-4 on
    # the one llama-2 frees. llama-1's engine ignores SIGTERM, so its step ends 2 s after
    # llama-2's: when llama-3's turn comes its card is still held. llama-4, whose card is free,
    # goes first, and llama-3 starts once llama-1's step has freed its card; none fails.
    with fleet_of(tmp_path, cards=3) as fleet:
        fleet.start("llama-1", "gpu-a", [0], env={"STANDIN_IGNORE_SIGTERM": "1"})
        fleet.start("llama-2", "gpu-b", [0])
        fleet.start("llama-3", "gpu-a", [1])
        fleet.start("llama-4", "gpu-b", [1])
        fleet.change_profile(args=["--max-num-seqs", "8"])
        op = restart_start(model_name=MODEL, max_parallel=2, ready_timeout=30)
        planned = {s.old_replica.name: (s.planned_node, s.planned_cards) for s in steps_of(op)}
        assert planned == {
            "llama-1": ("gpu-a", [2]),
            "llama-2": ("gpu-b", [2]),
            "llama-3": ("gpu-a", [0]),
            "llama-4": ("gpu-b", [0]),
        }
        assert run_operation(op.pk) == "succeeded"
        steps = {s.old_replica.name: s for s in steps_of(op)}
        for name, step in steps.items():
            assert (step.state, step.node, step.cards) == ("succeeded", *planned[name]), step.reason
        assert steps["llama-2"].finished_at < steps["llama-4"].started_at < steps["llama-1"].finished_at
        assert steps["llama-1"].finished_at <= steps["llama-3"].started_at
        assert sum(fleet.ready_on_agents().values()) == 4
        assert_nothing_half_done()


# Steps run in threads only where their connections share the database: not the tests' in-memory SQLite.
@pytest.mark.postgres
def test_the_next_step_starts_once_a_replacement_is_ready_while_its_old_replica_is_still_stopping(
    tmp_path, actor
):
    # One at a time, two replicas on two nodes, each replacement planned on a free card of its own
    # node. llama-1's engine ignores SIGTERM, so its stop takes the agent's 2 s grace: the next
    # step does not wait for it (the slot is the replacement's, not the old engine's exit), yet
    # never starts before llama-1's replacement is ready (still one replacement loading at a time).
    with fleet_of(tmp_path) as fleet:
        first = fleet.start("llama-1", "gpu-a", [0], env={"STANDIN_IGNORE_SIGTERM": "1"})
        fleet.start("llama-2", "gpu-b", [0])
        fleet.change_profile(args=["--max-num-seqs", "8"])
        op = restart_start(model_name=MODEL, max_parallel=1, ready_timeout=30, settle_seconds=0)
        assert [(s.planned_node, s.planned_cards) for s in steps_of(op)] == [("gpu-a", [1]), ("gpu-b", [1])]
        assert run_operation(op.pk) == "succeeded"

        one, two = steps_of(op)
        assert (one.state, two.state) == ("succeeded", "succeeded")
        # Ready by its agent's word (the slot frees then, before the worker records it).
        ready = datetime.fromisoformat(fleet.agents["gpu-a"].replica(one.new_replica.name)["ready_at"])
        stopped = AuditEntry.objects.get(object_key="llama-1", action="stop").at
        # The step ends in the old replica's stop's own transaction: its end, then the stop's entry.
        assert ready <= two.started_at < one.finished_at <= stopped
        assert (stopped - ready).total_seconds() >= 1.5  # the grace, then SIGKILL
        first.refresh_from_db()
        assert first.state == "stopped" and not Shard.objects.filter(replica=first).exists()
        assert sum(fleet.ready_on_agents().values()) == 2
        assert verify_chain() == []
        assert_nothing_half_done()


@pytest.mark.postgres  # SQLite runs the steps one after the other, in the run's own thread
def test_the_step_threads_keep_their_connections_from_step_to_step_and_the_run_closes_them(
    tmp_path, actor, monkeypatch
):
    # Four steps one at a time run on at most two step threads (2 × max_parallel): each thread's
    # connection is kept for its next step (a connection a step started a PostgreSQL backend
    # anew for each), and none is left open once the run ends.
    from django.db.backends.postgresql.base import DatabaseWrapper

    opened: list[int] = []
    connect = DatabaseWrapper.get_new_connection

    def counted(self, params):
        opened.append(threading.get_ident())
        return connect(self, params)

    def open_here() -> int:
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()")
            return cursor.fetchone()[0]

    with fleet_of(tmp_path) as fleet:
        for i, (node, card) in enumerate([("gpu-a", 0), ("gpu-a", 1), ("gpu-b", 0), ("gpu-b", 1)]):
            fleet.start(f"llama-{i + 1}", node, [card])
        fleet.change_profile(args=["--max-num-seqs", "8"])
        op = restart_start(model_name=MODEL, max_parallel=1, ready_timeout=30, settle_seconds=0)
        before = open_here()
        monkeypatch.setattr(DatabaseWrapper, "get_new_connection", counted)
        assert run_operation(op.pk) == "succeeded"
        monkeypatch.undo()
        steps = steps_of(op)
        assert [s.state for s in steps] == ["succeeded"] * 4
        # The heartbeat's thread opens one; the step threads one each, at most two.
        assert len(opened) <= 3, opened
        assert _when(lambda: open_here() == before, within=5)
        # Each step ended in its old replica's stop's own transaction: the step row's last writer
        # (xmin, 32 bits) is the transaction of the stop's audit entry (txid_current, 64 bits).
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT id, xmin::text FROM operations_restartstep WHERE id = ANY(%s)",
                [[s.pk for s in steps]],
            )
            last_writer = {pk: int(xmin) for pk, xmin in cursor.fetchall()}
        for step in steps:
            stop = AuditEntry.objects.get(object_key=step.old_replica.name, action="stop")
            assert stop.txid is not None and stop.txid % 2**32 == last_writer[step.pk], step.reason


@pytest.mark.postgres  # a row held locked beside the runner's writes: SQLite locks the whole database
def test_the_next_step_starts_once_the_agent_says_a_replacement_is_ready_before_that_is_recorded(
    tmp_path, actor
):
    # One at a time, no settle time. Once llama-1's replacement is recorded loading, the test holds
    # its row locked, so the write that records it ready waits. llama-2's step still starts: the
    # slot is the replacement's load, which its agent said is over; the write need not come first.
    with fleet_of(tmp_path) as fleet:
        fleet.start("llama-1", "gpu-a", [0])
        fleet.start("llama-2", "gpu-b", [0])
        fleet.change_profile(args=["--max-num-seqs", "8"], env={"STANDIN_LOAD_SECONDS": "1.5"})
        op = restart_start(model_name=MODEL, max_parallel=1, ready_timeout=30, settle_seconds=0)
        one_id, two_id = [s.pk for s in steps_of(op)]
        ended: list[str] = []

        def run() -> None:
            try:
                ended.append(run_operation(op.pk))
            finally:
                connection.close()  # the thread's own

        runner = threading.Thread(target=run)
        runner.start()
        try:
            new_id = _when(lambda: RestartStep.objects.get(pk=one_id).new_replica_id, within=30)
            _when(lambda: Replica.objects.get(pk=new_id).state == "loading", within=30)
            with transaction.atomic():
                Replica.objects.select_for_update().get(pk=new_id)
                started = _when(lambda: RestartStep.objects.get(pk=two_id).started_at, within=4)
                assert Replica.objects.get(pk=new_id).state == "loading"  # its ready not recorded yet
        finally:
            runner.join(timeout=60)
        assert started is not None, "the next step waited for the ready write"
        assert ended == ["succeeded"]
        one = RestartStep.objects.select_related("new_replica").get(pk=one_id)
        assert one.new_replica.state == "ready"
        assert AuditEntry.objects.filter(object_key=one.new_replica.name, action="ready").count() == 1
        assert_nothing_half_done()


def _when(value, *, within: float):
    """``value()`` once it is truthy, asked every 50 ms for ``within`` s; its last answer otherwise."""
    deadline = time.monotonic() + within
    while True:
        got = value()
        if got or time.monotonic() >= deadline:
            return got
        time.sleep(0.05)


def test_a_step_let_go_first_never_takes_cards_a_later_steps_old_replica_still_serves(tmp_path, actor):
    # One node of four cards, three replicas, one card free. One at a time the plan puts llama-1's
    # replacement on card 3, llama-2's on the card llama-1 frees (0), llama-3's on the one llama-2
    # frees (1). llama-1's engine ignores SIGTERM: once its replacement is ready, llama-2's card is
    # still held by it, and llama-3's by llama-2, whose step has not started. llama-3 must not go
    # first (it would find no card and fail): each waits its turn, and all go where planned.
    with fleet_of(tmp_path, nodes=("gpu-a",)) as fleet:
        fleet.start("llama-1", "gpu-a", [0], env={"STANDIN_IGNORE_SIGTERM": "1"})
        fleet.start("llama-2", "gpu-a", [1])
        fleet.start("llama-3", "gpu-a", [2])
        fleet.change_profile(args=["--max-num-seqs", "8"])
        op = restart_start(model_name=MODEL, max_parallel=1, ready_timeout=30, settle_seconds=0)
        planned = [(s.old_replica.name, s.planned_node, s.planned_cards) for s in steps_of(op)]
        assert planned == [("llama-1", "gpu-a", [3]), ("llama-2", "gpu-a", [0]), ("llama-3", "gpu-a", [1])]
        assert run_operation(op.pk) == "succeeded"

        steps = steps_of(op)
        assert [(s.state, s.node, s.cards) for s in steps] == [
            ("succeeded", "gpu-a", c) for _, _, c in planned
        ]
        assert steps[0].finished_at <= steps[1].started_at and steps[1].finished_at <= steps[2].started_at
        assert sum(fleet.ready_on_agents().values()) == 3
        assert_nothing_half_done()


def test_a_replacement_never_ready_fails_at_its_deadline_and_the_old_one_keeps_serving(tmp_path, actor):
    with fleet_of(tmp_path) as fleet:
        old = fleet.start("llama-1", "gpu-a", [0])
        fleet.start("llama-2", "gpu-a", [1])
        fleet.change_profile(env={"STANDIN_LOAD_SECONDS": "0.2", "STANDIN_NEVER_READY": "1"})
        op = restart_start(model_name=MODEL, ready_timeout=1.5)
        assert run_operation(op.pk) == "failed"

        first, second = steps_of(op)
        assert first.state == "failed" and "was not ready within 1.5 s" in first.reason, first.reason
        assert "loading" in first.reason and "llama-1 keeps serving" in first.reason
        # The first failure does not hold the others back (stop_at_first_failure is off by default).
        assert second.state == "failed" and "was not ready within 1.5 s" in second.reason, second.reason
        new = first.new_replica
        assert new.state == "failed" and not new.shards.exists()
        assert fleet.agents[first.node].replica(new.name)["state"] == "stopped"
        old.refresh_from_db()
        assert old.state == "ready" and answers(old.port)
        op.refresh_from_db()
        assert op.reason.startswith(
            "0 of 2 replica(s) restarted; llama has 2 replica(s) serving now; llama-1: "
        )
        assert AuditEntry.objects.filter(action="fail", object_key=new.name, via="worker").exists()
        assert_nothing_half_done()


def test_an_engine_that_exits_at_start_fails_its_step_with_the_exit_code_and_log(tmp_path, actor):
    with fleet_of(tmp_path) as fleet:
        fleet.start("llama-1", "gpu-a", [0])
        fleet.change_profile(env={"STANDIN_EXIT_AT_START": "3"})
        op = restart_start(model_name=MODEL, ready_timeout=20)
        assert run_operation(op.pk) == "failed"
        (step,) = steps_of(op)
        assert "exit code 3" in step.reason, step.reason
        assert "stand-in told to fail at start" in step.reason
        assert_nothing_half_done()


def test_an_in_place_replacement_that_fails_brings_the_old_spec_back_on_its_cards(tmp_path, actor):
    with fleet_of(tmp_path) as fleet:
        old = fleet.start("llama-1", "gpu-a", [1])
        fleet.change_profile(env={"STANDIN_EXIT_AT_START": "3"})
        op = restart_start(model_name=MODEL, in_place=True, ready_timeout=20)
        assert run_operation(op.pk) == "failed"
        (step,) = steps_of(op)
        assert "exit code 3" in step.reason
        assert "llama-1 was started again with its previous spec and is ready" in step.reason
        old.refresh_from_db()
        assert old.state == "ready" and list(old.shards.values_list("card__index", flat=True)) == [1]
        assert answers(old.port)
        state = fleet.agents["gpu-a"].replica("llama-1")
        assert state["state"] == "ready"
        assert_nothing_half_done()


def test_an_old_replica_whose_agent_is_gone_is_held_stopping_until_its_agent_confirms(tmp_path, actor):
    with fleet_of(tmp_path) as fleet:
        first = fleet.start("llama-1", "gpu-a", [0])
        second = fleet.start("llama-2", "gpu-b", [0])
        # gpu-b's other cards are held (by another model), so llama-2's replacement goes beside llama-1's.
        b.replica(
            b.profile(b.llama_8b("filler")), fleet.nodes["gpu-b"], [1, 2, 3], name="filler-1", port=8999
        )
        fleet.change_profile(args=["--max-num-seqs", "8"])
        fleet.agents["gpu-b"].stop()  # llama-2 is recorded ready on a node whose agent is down
        op = restart_start(model_name=MODEL, ready_timeout=20)
        assert run_operation(op.pk) == "succeeded"

        one, two = steps_of(op)
        assert one.state == "succeeded" and one.node == "gpu-a", one.reason
        # The replacement ran beside llama-1's and serves; llama-2's stop was never confirmed.
        assert two.state == "succeeded" and two.node == "gpu-a", two.reason
        assert "but llama-2's stop is not confirmed" in two.reason, two.reason
        assert "The agent of node gpu-b" in two.reason and "is the agent running?" in two.reason, two.reason
        first.refresh_from_db()
        second.refresh_from_db()
        assert first.state == "stopped"
        # Not freed, not said to run: stopping, holding its cards until its agent confirms.
        assert second.state == "stopping" and second.shards.exists(), second.state
        assert "is the agent running?" in second.reason
        assert AuditEntry.objects.filter(action="stop_unconfirmed", object_key="llama-2").exists()
        assert two.new_replica.state == "ready" and answers(two.new_replica.port)
        op.refresh_from_db()
        assert op.reason.startswith("2 of 2 replica(s) restarted; llama has 2 replica(s) serving now")


def test_a_stale_replica_is_restarted_with_the_spec_of_its_revision_known_from_the_audit_log(tmp_path, actor):
    from operations.services.specs import running_spec

    with fleet_of(tmp_path) as fleet:
        fleet.change_profile(args=["--max-num-seqs", "4"])
        old = fleet.start("llama-1", "gpu-a", [0])
        fleet.change_profile(args=["--max-num-seqs", "8"])
        spec = running_spec(Replica.objects.get(pk=old.pk))
        assert spec is not None and spec["args"][-2:] == ["--max-num-seqs", "4"]


def test_a_cancel_lets_the_step_in_flight_finish_and_starts_no_other(tmp_path, actor):
    from operations.services.lease import Lease, claim
    from operations.services.runner import OperationRun
    from operations.services.runner.rolling import place_beside
    from operations.services.start import operation_cancel

    with fleet_of(tmp_path) as fleet:
        fleet.start("llama-1", "gpu-a", [0])
        second = fleet.start("llama-2", "gpu-b", [0])
        fleet.change_profile(args=["--max-num-seqs", "8"])
        op = restart_start(model_name=MODEL, ready_timeout=30)
        # A worker has the first step in flight when the operator cancels.
        claimed = claim(op.pk, "worker:first-1")
        run = OperationRun(claimed, Lease(op.pk, "worker:first-1"), actor)
        step = run.records.step(steps_of(op)[0].pk)
        assert place_beside(run.parts, step, None)
        operation_cancel(operation_id=op.pk)
        assert RestartOperation.objects.get(pk=op.pk).state == "running"  # it has a worker: it finishes first

        assert run.run() == "cancelled"
        first, rest = steps_of(op)
        assert first.state == "succeeded"
        assert (rest.state, rest.reason) == ("cancelled", "cancelled by request")
        second.refresh_from_db()
        assert second.state == "ready" and answers(second.port)
        op.refresh_from_db()
        assert op.reason == (
            "1 of 2 replica(s) restarted; llama has 2 replica(s) serving now; the rest cancelled on request."
        )
        assert_nothing_half_done()


def test_a_replacement_whose_port_another_program_holds_moves_to_the_next_port(tmp_path, actor, settings):
    import socket

    with fleet_of(tmp_path) as fleet, socket.socket() as squatter:
        fleet.start("llama-1", "gpu-a", [0])
        fleet.change_profile(args=["--max-num-seqs", "8"])
        taken = settings.LLMGW_REPLICA_PORT_BASE  # where the replacement would go
        squatter.bind(("127.0.0.1", taken))
        squatter.listen()
        op = restart_start(model_name=MODEL, ready_timeout=30)
        assert run_operation(op.pk) == "succeeded"
        (step,) = steps_of(op)
        new = step.new_replica
        assert new.port == taken + 1 and answers(new.port)
        assert step.spec["port"] == taken + 1 and str(taken + 1) in step.spec["args"]
        moved = AuditEntry.objects.get(action="move_port", object_key=new.name)
        assert (moved.before, moved.after, moved.via) == ({"port": taken}, {"port": taken + 1}, "worker")
        assert f"Port {taken} is in use by another program" in moved.message
        assert_nothing_half_done()


def test_the_worker_learns_a_replacement_is_ready_when_the_agent_does_not_on_its_next_poll(
    tmp_path, actor, settings
):
    # A poll this slow would make the step last at least 5 s; the long poll answers at readiness.
    settings.LLMGW_OPERATION_POLL_SECONDS = 5
    settings.LLMGW_AGENT_WAIT_SECONDS = 5
    with fleet_of(tmp_path, load_seconds=0.5) as fleet:
        fleet.start("llama-1", "gpu-a", [0])
        fleet.change_profile(args=["--max-num-seqs", "8"])
        op = restart_start(model_name=MODEL, ready_timeout=30)
        assert run_operation(op.pk) == "succeeded"
        step = RestartOperation.objects.get(pk=op.pk).steps.get()
        assert step.state == "succeeded", step.reason
        assert (step.finished_at - step.started_at).total_seconds() < 3.5
