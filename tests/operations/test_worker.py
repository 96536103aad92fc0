"""The worker: claiming, heartbeats, takeover of an abandoned operation, the sweep.

Tests with real ``manage.py db_worker`` processes are PostgreSQL-only: on
SQLite the test database pytest-django creates is in memory, which another
process cannot open (and a file-backed one for the whole suite would be
shared by concurrent runs). The claim and takeover rules themselves are
tested on both, in this process.
"""

from __future__ import annotations

import os
import signal
from datetime import timedelta
from io import StringIO

import pytest
from agent_testing import wait_until
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone
from django_tasks_db.models import DBTaskResult

from audit.models import AuditEntry
from catalog.models import Replica
from operations.models import RestartOperation, RestartStep
from operations.services.lease import Lease, OperationLost, claim
from operations.services.runner import OperationRun, run_operation
from operations.services.runner.rolling import place_beside
from operations.services.start import operation_cancel, restart_start
from operations.tasks import enqueue_restart, operations_sweep, run_restart
from tests.support.restart import (
    MODEL,
    Fleet,
    answers,
    assert_nothing_half_done,
    db_worker,
    fleet_of,
    wait_for_operation,
)

pytestmark = pytest.mark.usefixtures("fast_restarts")

Op = RestartOperation


def launches(fleet: Fleet, name: str) -> int:
    """How many times the agents started a process for replica ``name`` (their logs' header lines:
    one file per start attempt)."""
    count = 0
    for agent in fleet.agents.values():
        for log in agent.log_dir.glob(f"{name}.attempt-*.log"):
            count += log.read_text(errors="replace").count(f"llmgw-agent: starting replica {name} ")
    return count


def stale(op: RestartOperation, worker: str = "worker:gone-1") -> None:
    RestartOperation.objects.filter(pk=op.pk).update(
        state="running", worker=worker, heartbeat_at=timezone.now() - timedelta(minutes=5), attempts=1
    )


# --- claiming, in this process ---------------------------------------------------------------------


@pytest.mark.django_db
def test_a_claimed_operation_cannot_be_claimed_again_until_its_heartbeat_is_stale(actor):
    from tests.support import builders as b

    node = b.node("gpu-1", cards=2)
    profile = b.profile(b.llama_8b(MODEL))
    b.replica(profile, node, [0], name="llama-1")
    op = restart_start(model_name=MODEL, replicas=["llama-1"])

    first = claim(op.pk, "worker:a-1")
    assert first is not None and (first.state, first.worker, first.attempts) == ("running", "worker:a-1", 1)
    assert claim(op.pk, "worker:b-2") is None

    RestartOperation.objects.filter(pk=op.pk).update(heartbeat_at=timezone.now() - timedelta(seconds=6))
    taken = claim(op.pk, "worker:b-2")
    assert taken is not None and (taken.worker, taken.attempts) == ("worker:b-2", 2)
    entry = AuditEntry.objects.get(action="restart_takeover")
    assert (entry.actor, entry.via) == ("worker:b-2", "worker")
    assert "taken over from worker:a-1" in entry.message and "asked by pytest" in entry.message

    # The first worker's lease is gone: its next heartbeat says so, and it stops.
    lease = Lease(op.pk, "worker:a-1")
    lease.interval = 0
    with pytest.raises(OperationLost):
        lease.tick()
    assert run_operation(op.pk, worker="worker:c-3") == "not_claimed"


@pytest.mark.django_db
def test_the_sweep_enqueues_a_run_only_for_operations_no_live_worker_holds(
    actor, django_capture_on_commit_callbacks
):
    from tests.support import builders as b

    node = b.node("gpu-1", cards=4)
    b.replica(b.profile(b.llama_8b(MODEL)), node, [0], name="llama-1")
    with django_capture_on_commit_callbacks(execute=True):
        op = restart_start(model_name=MODEL, replicas=["llama-1"])
    op.refresh_from_db()
    task = DBTaskResult.objects.get(id=op.task_id)
    assert (task.task_path, task.args_kwargs["args"], task.status) == (
        "operations.tasks.run_restart",
        [op.pk],
        "READY",
    )
    assert (
        DBTaskResult.objects.filter(task_path="operations.tasks.sweep_restarts", status="READY").count() == 1
    )

    assert operations_sweep() == []  # queued, and its run waits for a worker
    RestartOperation.objects.filter(pk=op.pk).update(
        state="running", worker="worker:x-1", heartbeat_at=timezone.now(), attempts=1
    )
    DBTaskResult.objects.filter(id=op.task_id).update(status="RUNNING", started_at=timezone.now())
    assert operations_sweep() == []  # alive

    stale(op, "worker:x-1")  # the worker died: no heartbeat for minutes, its task stuck RUNNING
    assert operations_sweep() == [op.pk]
    op.refresh_from_db()
    assert DBTaskResult.objects.get(id=op.task_id).status == "READY"
    assert operations_sweep() == []  # a run already waits


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("audit_flushable")
def test_a_step_left_waiting_by_a_dead_worker_is_resumed_without_starting_its_replica_twice(tmp_path, actor):
    with fleet_of(tmp_path) as fleet:
        old = fleet.start("llama-1", "gpu-a", [0])
        fleet.change_profile(args=["--max-num-seqs", "8"])
        op = restart_start(model_name=MODEL, ready_timeout=30)
        # A first worker placed and started the replacement, then died before it was ready.
        first = claim(op.pk, "worker:dead-1")
        run = OperationRun(first, Lease(op.pk, "worker:dead-1"), actor)
        step = run.records.step(op.steps.get().pk)
        assert place_beside(run.parts, step, None)
        fleet.agents[step.node].client().put(f"/v1/replicas/{step.new_replica.name}", json=step.spec)
        RestartStep.objects.filter(pk=step.pk).update(state="waiting")
        stale(op, "worker:dead-1")

        assert run_operation(op.pk, worker="worker:next-2") == "succeeded"
        step.refresh_from_db()
        op.refresh_from_db()
        assert (op.worker, op.attempts, step.state) == ("worker:next-2", 2, "succeeded")
        assert launches(fleet, step.new_replica.name) == 1
        old.refresh_from_db()
        assert old.state == "stopped" and answers(step.new_replica.port)
        assert_nothing_half_done()


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("audit_flushable")
def test_an_operation_taken_over_too_often_is_failed_with_its_steps_in_flight_rolled_back(
    tmp_path, actor, settings
):
    settings.LLMGW_OPERATION_MAX_ATTEMPTS = 2
    with fleet_of(tmp_path) as fleet:
        old = fleet.start("llama-1", "gpu-a", [0])
        fleet.change_profile(args=["--max-num-seqs", "8"])
        op = restart_start(model_name=MODEL, ready_timeout=30)
        first = claim(op.pk, "worker:dead-1")
        run = OperationRun(first, Lease(op.pk, "worker:dead-1"), actor)
        step = run.records.step(op.steps.get().pk)
        assert place_beside(run.parts, step, None)
        fleet.agents[step.node].client().put(f"/v1/replicas/{step.new_replica.name}", json=step.spec)
        stale(op, "worker:dead-2")
        RestartOperation.objects.filter(pk=op.pk).update(attempts=2)

        assert run_operation(op.pk, worker="worker:next-3") == "failed"
        op.refresh_from_db()
        step.refresh_from_db()
        assert "took this restart up 2 time(s) without finishing it" in op.reason
        assert step.state == "failed" and step.new_replica.state == "failed"
        assert fleet.agents[step.node].replica(step.new_replica.name)["state"] == "stopped"
        old.refresh_from_db()
        assert old.state == "ready" and answers(old.port)
        assert_nothing_half_done()


@pytest.mark.django_db
def test_cancelling_a_queued_restart_ends_it_at_once_and_is_audited(actor):
    from tests.support import builders as b

    node = b.node("gpu-1", cards=2)
    b.replica(b.profile(b.llama_8b(MODEL)), node, [0], name="llama-1")
    op = restart_start(model_name=MODEL, replicas=["llama-1"])
    op = operation_cancel(operation_id=op.pk)
    assert (op.state, op.cancel_requested) == ("cancelled", True)
    assert list(op.steps.values_list("state", flat=True)) == ["cancelled"]
    assert AuditEntry.objects.get(action="restart_cancel").actor == "pytest"
    assert claim(op.pk, "worker:a-1") is None


# --- real worker processes (PostgreSQL) --------------------------------------------------------------


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_worker_killed_mid_restart_is_taken_over_and_the_restart_completes(tmp_path, actor, settings):
    with fleet_of(tmp_path, load_seconds=0.5, processes=True) as fleet:
        old = [
            fleet.start("llama-1", "gpu-a", [0]),
            fleet.start("llama-2", "gpu-b", [0]),
            fleet.start("llama-3", "gpu-b", [1]),
        ]
        fleet.change_profile(env={"STANDIN_LOAD_SECONDS": "2"})
        base = settings.LLMGW_REPLICA_PORT_BASE
        with db_worker(tmp_path, "worker-a", port_base=base) as first:
            op = restart_start(model_name=MODEL, ready_timeout=60)
            wait_until(
                lambda: RestartStep.objects.filter(operation=op, state="waiting").exists(),
                timeout=60,
                interval=0.1,
                what="a step waiting for its replacement",
            )
            victim = RestartOperation.objects.get(pk=op.pk).worker
            os.kill(first.process.pid, signal.SIGKILL)
            first.process.wait(timeout=10)
        began = timezone.now()
        with db_worker(tmp_path, "worker-b", port_base=base) as second:
            op = wait_for_operation(op.pk, timeout=120)
        assert timezone.now() - began < timedelta(minutes=2)
        assert op.state == "succeeded", (op.reason, second.output())
        assert op.attempts == 2 and op.worker != victim
        assert AuditEntry.objects.filter(action="restart_takeover", message__contains=victim).exists()
        for step in op.steps.select_related("new_replica"):
            assert step.state == "succeeded", step.reason
            assert launches(fleet, step.new_replica.name) == 1  # never started twice
            assert answers(step.new_replica.port)
        for replica in old:
            replica.refresh_from_db()
            assert replica.state == "stopped"
        assert_nothing_half_done()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_two_workers_never_run_the_same_operation(tmp_path, actor, settings):
    with fleet_of(tmp_path, processes=True) as fleet:
        fleet.start("llama-1", "gpu-a", [0])
        fleet.start("llama-2", "gpu-b", [0])
        fleet.change_profile(args=["--max-num-seqs", "8"])
        base = settings.LLMGW_REPLICA_PORT_BASE
        op = restart_start(model_name=MODEL, max_parallel=2, ready_timeout=30)
        # Three runs of the same operation queued at once, as a sweep racing the first enqueue could.
        enqueue_restart(op.pk)
        enqueue_restart(op.pk)
        with db_worker(tmp_path, "worker-a", port_base=base), db_worker(tmp_path, "worker-b", port_base=base):
            op = wait_for_operation(op.pk, timeout=60)
            wait_until(
                lambda: (
                    not DBTaskResult.objects.filter(
                        task_path=run_restart.module_path, status__in=["READY", "RUNNING"]
                    ).exists()
                ),
                timeout=30,
                what="every queued run to be done",
            )
        assert op.state == "succeeded" and op.attempts == 1, op.reason
        results = sorted(
            DBTaskResult.objects.filter(task_path=run_restart.module_path).values_list(
                "return_value", flat=True
            )
        )
        assert results == ["not_claimed", "not_claimed", "succeeded"]
        for step in op.steps.select_related("new_replica"):
            assert launches(fleet, step.new_replica.name) == 1
        assert Replica.objects.filter(state="ready").count() == 2
        assert_nothing_half_done()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_restart_command_waits_for_the_worker_and_its_exit_code_follows_the_outcome(
    tmp_path, actor, settings
):
    with fleet_of(tmp_path, processes=True) as fleet:
        fleet.start("llama-1", "gpu-a", [0])
        fleet.change_profile(args=["--max-num-seqs", "8"])
        with db_worker(tmp_path, "worker-a", port_base=settings.LLMGW_REPLICA_PORT_BASE):
            out = StringIO()
            call_command(
                "restart", MODEL, "--ready-timeout", "30", "--as", "ops-bot", stdout=out, stderr=StringIO()
            )
            assert "llama-1 → llama-2" in out.getvalue() and "Succeeded" in out.getvalue()
            assert "1 of 1 replica(s) restarted" in out.getvalue()

            fleet.change_profile(env={"STANDIN_LOAD_SECONDS": "0.2", "STANDIN_NEVER_READY": "1"})
            out = StringIO()
            with pytest.raises(CommandError) as failed:
                call_command("restart", MODEL, "--ready-timeout", "1", stdout=out, stderr=StringIO())
        assert failed.value.returncode == 1
        assert "was not ready within 1 s" in str(failed.value)
        assert "failed: " in out.getvalue()
        assert RestartOperation.objects.filter(
            requested_by_name="ops-bot", via="cli", state="succeeded"
        ).exists()
        assert_nothing_half_done()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_gpus_and_context_commands_follow_the_restart_they_start(tmp_path, actor, settings):
    with fleet_of(tmp_path, processes=True) as fleet:
        fleet.start("llama-1", "gpu-a", [0])
        with db_worker(tmp_path, "worker-a", port_base=settings.LLMGW_REPLICA_PORT_BASE):
            out = StringIO()
            call_command("gpus", MODEL, "2", "--as", "ops-bot", stdout=out, stderr=StringIO())
            text = out.getvalue()
            assert "changed llama/h100" in text and "restarting 1 replica(s)" in text
            # It waited for the worker: the restart had ended when the command returned.
            op = RestartOperation.objects.get(model__name=MODEL, profile__tp=2)
            assert op.state == "succeeded" and f"restart #{op.pk} Succeeded" in text
            assert "llama-1 → llama-2 on " in text

            out = StringIO()
            call_command("context", MODEL, "8192", "--no-wait", stdout=out, stderr=StringIO())
            started = RestartOperation.objects.exclude(pk=op.pk).get()
            assert "Succeeded" not in out.getvalue()  # returned at once
            wait_until(
                lambda: RestartOperation.objects.get(pk=started.pk).state == "succeeded",
                timeout=60,
                what="the context's restart to end",
            )
        assert_nothing_half_done()
