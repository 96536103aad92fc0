"""Restarts under faults, run by real ``db_worker`` processes on PostgreSQL against real agents and stand-in
engines: each test ends by comparing the catalog with what the agents run (``catalog_differences``).

The faults: an agent killed while a replacement loads and back 6 s later; an engine killed behind the
agent's back; a replacement that falls over a second after it was ready; an agent that hangs, with the
shortest settings allowed; one node's agent down among three; in place, with both specs failing.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

import pytest
from agent_testing import wait_until
from django.db.models import Max

from audit.models import AuditEntry, RowChange
from audit.selectors import changed_outside
from catalog.models import Node, Replica, Shard
from operations.models import RestartOperation, RestartStep
from operations.services.start import restart_start
from tests.support.restart import (
    MODEL,
    answers,
    assert_catalog_is_what_agents_run,
    assert_nothing_half_done,
    catalog_differences,
    db_worker,
    engines_on,
    fleet_of,
    kill_agent,
    respawn_agent,
    wait_for_operation,
)

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("fast_restarts"),
]


def steps_of(op: RestartOperation) -> list[RestartStep]:
    return list(op.steps.select_related("old_replica", "new_replica").order_by("id"))


def in_line(fleet, timeout: float = 30) -> None:
    """Wait until the reconciler has brought the catalog in line with the agents, then check it is."""
    with contextlib.suppress(TimeoutError):  # said below, with the differences
        wait_until(
            lambda: not catalog_differences(fleet), timeout=timeout, interval=0.3, what="the catalog in line"
        )
    assert_catalog_is_what_agents_run(fleet)


def test_an_agent_killed_while_a_replacement_loads_and_back_6_s_later_leaves_nothing_unheld(
    tmp_path, actor, settings
):
    with fleet_of(tmp_path, processes=True) as fleet:
        fleet.start("llama-1", "gpu-a", [0])
        fleet.start("llama-2", "gpu-b", [0])
        fleet.change_profile(env={"STANDIN_LOAD_SECONDS": "4"})
        with db_worker(tmp_path, "worker-a", port_base=settings.LLMGW_REPLICA_PORT_BASE) as worker:
            op = restart_start(model_name=MODEL, ready_timeout=60)
            step = wait_until(
                lambda: RestartStep.objects.filter(operation=op, state="waiting").first(),
                timeout=60,
                interval=0.1,
                what="a replacement loading",
            )
            agent = fleet.agents[step.node]
            kill_agent(agent)
            time.sleep(6)  # the fault: the agent is away 6 s (LLMGW_AGENT_ABSENT_SECONDS is 12 here)
            respawn_agent(agent)
            op = wait_for_operation(op.pk, timeout=120)
            assert op.state == "succeeded", (op.reason, worker.output())
            for s in steps_of(op):
                assert s.state == "succeeded", s.reason
                assert s.new_replica.state == "ready" and answers(s.new_replica.port)
            assert not Replica.objects.filter(state__in=["stopping", "unknown"]).exists()
            in_line(fleet)
            assert_nothing_half_done()

            # The next restart finds every card where the catalog says, and succeeds.
            fleet.change_profile(env={"STANDIN_LOAD_SECONDS": "0.5"})
            again = wait_for_operation(restart_start(model_name=MODEL, ready_timeout=60).pk, timeout=120)
            assert again.state == "succeeded", (again.reason, worker.output())
            in_line(fleet)
            assert_nothing_half_done()


def test_an_engine_killed_behind_the_agent_is_failed_in_the_catalog_within_two_reconcile_periods(
    tmp_path, actor, settings
):
    period = 3.0
    with fleet_of(tmp_path, nodes=("gpu-a",), processes=True) as fleet:
        replica = fleet.start("llama-1", "gpu-a", [0])
        keep = fleet.start("llama-2", "gpu-a", [1])
        pid = fleet.agents["gpu-a"].replica("llama-1")["pid"]
        extra = {"LLMGW_RECONCILE_SECONDS": str(period)}
        with db_worker(tmp_path, "worker-a", port_base=settings.LLMGW_REPLICA_PORT_BASE, extra_env=extra):
            # The worker's first pass, as it starts: the fleet is in line, nothing changes.
            wait_until(
                lambda: Node.objects.get(name="gpu-a").last_seen_at is not None,
                timeout=30,
                what="a first pass",
            )
            os.killpg(pid, signal.SIGKILL)
            killed = time.monotonic()

            def failed() -> Replica | None:
                row = Replica.objects.get(pk=replica.pk)
                return row if row.state == "failed" else None

            row = wait_until(failed, timeout=4 * period, interval=0.1, what="llama-1 failed in the catalog")
            took = time.monotonic() - killed
        assert took <= 2 * period, f"the catalog said failed {took:.1f} s after the kill"
        assert "killed by" in row.reason or "exit code" in row.reason, row.reason
        assert not Shard.objects.filter(replica=row).exists()  # the agent says nothing runs on its card
        entry = AuditEntry.objects.get(action="reconcile", object_key="llama-1")
        assert (entry.actor, entry.via) == ("reconciler", "worker")
        assert entry.before["state"] == "ready" and entry.after["state"] == "failed"
        keep.refresh_from_db()
        assert keep.state == "ready"
        assert_catalog_is_what_agents_run(fleet)


def test_a_replacement_that_exits_a_second_after_ready_fails_its_step_and_the_old_one_serves(
    tmp_path, actor, settings
):
    with fleet_of(tmp_path, nodes=("gpu-a",), cards=2, processes=True) as fleet:
        old = fleet.start("llama-1", "gpu-a", [0])
        fleet.change_profile(env={"STANDIN_LOAD_SECONDS": "0.5", "STANDIN_CRASH_AFTER": "1.5"})
        with db_worker(tmp_path, "worker-a", port_base=settings.LLMGW_REPLICA_PORT_BASE) as worker:
            op = restart_start(model_name=MODEL, ready_timeout=30, settle_seconds=5)
            op = wait_for_operation(op.pk, timeout=60)
        assert op.state == "failed", (op.reason, worker.output())
        (step,) = steps_of(op)
        assert step.state == "failed"
        assert f"{step.new_replica.name} was ready, then failed" in step.reason, step.reason
        assert "within the 5 s it had to stay ready" in step.reason and "llama-1 keeps serving" in step.reason
        assert step.new_replica.state == "failed" and not step.new_replica.shards.exists()
        old.refresh_from_db()
        assert old.state == "ready" and answers(old.port)
        assert "llama has 1 replica(s) serving now" in op.reason and op.serving_after == 1
        assert_catalog_is_what_agents_run(fleet)
        assert_nothing_half_done()


SHORTEST = {
    "LLMGW_OPERATION_STALE_SECONDS": "2",
    "LLMGW_OPERATION_HEARTBEAT_SECONDS": "0.5",
    "LLMGW_AGENT_TIMEOUT_SECONDS": "1",
    "LLMGW_AGENT_WAIT_SECONDS": "0.5",
    "LLMGW_AGENT_STOP_SECONDS": "1.5",
    "LLMGW_STOP_DRAIN_SECONDS": "0.2",
    "LLMGW_AGENT_ABSENT_SECONDS": "3",
}


def test_a_hanging_agent_with_the_shortest_settings_has_one_worker_write_each_step_and_nothing_after_the_end(
    tmp_path, actor, settings
):
    with fleet_of(tmp_path, nodes=("gpu-a",), cards=2, processes=True) as fleet:
        old = fleet.start("llama-1", "gpu-a", [0])
        fleet.change_profile(env={"STANDIN_LOAD_SECONDS": "5"})
        agent = fleet.agents["gpu-a"]
        base = settings.LLMGW_REPLICA_PORT_BASE
        with (
            db_worker(tmp_path, "worker-a", port_base=base, extra_env=SHORTEST),
            db_worker(tmp_path, "worker-b", port_base=base, extra_env=SHORTEST),
        ):
            op = restart_start(model_name=MODEL, ready_timeout=60)
            wait_until(
                lambda: RestartStep.objects.filter(operation=op, state="waiting").exists(),
                timeout=60,
                interval=0.1,
                what="the replacement loading",
            )
            os.kill(agent.process.pid, signal.SIGSTOP)  # the agent hangs: every call runs into its timeout
            try:
                op = wait_for_operation(op.pk, timeout=90)
                ended = (op.state, op.reason, [(s.state, s.reason, s.finished_at) for s in steps_of(op)])
                # Well past the stale threshold and the longest call: a worker fenced out would write now.
                time.sleep(5)
            finally:
                os.kill(agent.process.pid, signal.SIGCONT)
            time.sleep(2)
            op.refresh_from_db()
            assert (op.state, op.reason, [(s.state, s.reason, s.finished_at) for s in steps_of(op)]) == ended
            entries = list(AuditEntry.objects.filter(request_id=f"restart-{op.pk}").order_by("id"))
            # The operation's end is the last thing written for it.
            assert [e.action for e in entries].count("restart_finish") == 1
            assert entries[-1].action == "restart_finish", [(e.action, e.actor) for e in entries]
            # One worker at a time: once another has taken over, the first never writes again.
            actors = [e.actor for e in entries]
            runs = [a for i, a in enumerate(actors) if i == 0 or actors[i - 1] != a]
            assert len(runs) == len(set(runs)), runs
            assert op.state == "failed", op.reason
            (step,) = steps_of(op)
            assert "could not be watched" in step.reason, step.reason
            assert answers(old.port)  # it kept serving (its agent hung, not its engine)
            # The replacement's stop was never confirmed: it held its card as stopping, and the reconciler
            # stops it once the agent answers again (and says llama-1 is ready again, not unknown).
            wait_until(
                lambda: Replica.objects.get(pk=step.new_replica_id).state == "stopped",
                timeout=30,
                interval=0.2,
                what="the reconciler to confirm the replacement's stop",
            )
            in_line(fleet)
            old.refresh_from_db()
            assert old.state == "ready"


def test_with_one_agent_down_among_three_its_replicas_go_elsewhere_and_the_healthy_ones_are_restarted(
    tmp_path, actor, settings
):
    with fleet_of(tmp_path, nodes=("gpu-a", "gpu-b", "gpu-c"), cards=2, processes=True) as fleet:
        fleet.start("llama-1", "gpu-a", [0])
        fleet.start("llama-2", "gpu-b", [0])
        fleet.start("llama-3", "gpu-c", [0])
        fleet.change_profile(args=["--max-num-seqs", "8"])
        down = fleet.agents["gpu-c"]
        mark = RowChange.objects.aggregate(top=Max("id"))["top"] or 0
        kill_agent(down)  # its engine runs on, unseen
        with db_worker(tmp_path, "worker-a", port_base=settings.LLMGW_REPLICA_PORT_BASE) as worker:
            op = restart_start(model_name=MODEL, ready_timeout=60)
            op = wait_for_operation(op.pk, timeout=180)
            assert op.state == "succeeded", (op.reason, worker.output())
            steps = {s.old_replica.name: s for s in steps_of(op)}
            assert all(s.state == "succeeded" for s in steps.values()), [s.reason for s in steps.values()]
            assert steps["llama-3"].node in ("gpu-a", "gpu-b"), steps["llama-3"].reason
            assert "llama-3's stop is not confirmed" in steps["llama-3"].reason
            for s in steps.values():
                assert s.new_replica.state == "ready" and answers(s.new_replica.port)
            assert Replica.objects.get(name="llama-3").state == "stopping"
            node = Node.objects.get(name="gpu-c")
            assert not node.reachable and "gpu-c" in node.unreachable_reason
            assert "llama has 3 replica(s) serving now" in op.reason

            # Back: the reconciler stops llama-3 and frees its card; the catalog is what the agents run.
            respawn_agent(down)
            in_line(fleet)
            assert Replica.objects.get(name="llama-3").state == "stopped"
            assert Node.objects.get(name="gpu-c").reachable
            assert not engines_on(down)
        assert_nothing_half_done()
        # Every catalog row the workers and the reconciler changed is explained by an audit entry.
        assert not changed_outside().filter(id__gt=mark).exists(), list(
            changed_outside().filter(id__gt=mark).values_list("table_name", "operation", "after")
        )


def test_in_place_with_both_specs_failing_says_the_model_has_no_replica(tmp_path, actor, settings, client):
    from tests.support import builders as b

    with fleet_of(tmp_path, nodes=("gpu-a",), cards=1, load_seconds=3, processes=True) as fleet:
        old = fleet.start("llama-1", "gpu-a", [0])
        # The new spec exits at once; the old one loads for 3 s, longer than the 1.5 s it is given.
        fleet.change_profile(env={"STANDIN_LOAD_SECONDS": "3", "STANDIN_EXIT_AT_START": "3"})
        with db_worker(tmp_path, "worker-a", port_base=settings.LLMGW_REPLICA_PORT_BASE) as worker:
            op = restart_start(model_name=MODEL, in_place=True, ready_timeout=1.5)
            op = wait_for_operation(op.pk, timeout=60)
        assert op.state == "failed", (op.reason, worker.output())
        assert op.reason.startswith("0 of 1 replica(s) restarted; llama has no replica serving now;"), (
            op.reason
        )
        assert op.serving_after == 0
        (step,) = steps_of(op)
        assert "could not be started again either" in step.reason
        old.refresh_from_db()
        assert old.state == "failed" and not old.shards.exists()
        finish = AuditEntry.objects.get(action="restart_finish", object_key=str(op.pk))
        assert finish.after["serving"] == 0

        viewer = b.user("vera")
        client.force_login(viewer)
        page = client.get(f"/operations/{op.pk}/").content.decode()
        assert '<strong class="bad">llama has no replica serving now.</strong>' in page
        api = client.get(f"/api/operations/{op.pk}/").json()
        assert api["serving_after"] == 0 and "llama has no replica serving now" in api["reason"]
        assert_catalog_is_what_agents_run(fleet)
        assert not engines_on(fleet.agents["gpu-a"])
        assert_nothing_half_done()


def test_a_profile_save_during_a_running_restart_is_refused_busy_and_every_replica_runs_one_revision(
    tmp_path, actor, settings
):
    from django.test import Client
    from rest_framework.test import APIClient

    from catalog.models import Profile
    from tests.support import builders as b

    with fleet_of(tmp_path, processes=True) as fleet:
        fleet.start("llama-1", "gpu-a", [0])
        fleet.start("llama-2", "gpu-b", [0])
        profile = fleet.change_profile(env={"STANDIN_LOAD_SECONDS": "3"})
        api = APIClient()
        api.force_authenticate(b.user("alice", "catalog.change_profile", "catalog.resize_model"))
        root = b.user("root")
        root.is_superuser = root.is_staff = True
        root.save()
        admin = Client()
        admin.force_login(root)
        with db_worker(tmp_path, "worker-a", port_base=settings.LLMGW_REPLICA_PORT_BASE) as worker:
            op = restart_start(model_name=MODEL, ready_timeout=60)
            wait_until(
                lambda: RestartStep.objects.filter(operation=op, state="waiting").exists(),
                timeout=60,
                interval=0.1,
                what="a replacement loading",
            )
            attempts = {
                "api": api.patch(
                    f"/api/profiles/{profile.pk}/", {"args": ["--max-num-seqs", "8"]}, format="json"
                ),
                "resize": api.post(f"/api/models/{MODEL}/gpus/", {"gpus": 2}, format="json"),
                "context": api.post(f"/api/models/{MODEL}/context/", {"tokens": 8192}, format="json"),
            }
            for path, response in attempts.items():
                assert (response.status_code, response.json()["code"]) == (409, "busy"), (
                    path,
                    response.content,
                )
                assert (
                    f"Restart #{op.pk} of {MODEL} is running (/operations/{op.pk}/)"
                    in response.json()["detail"]
                )
            form = {
                "model": profile.model_id,
                "name": profile.name,
                "engine": "standin",
                "gpu_class": profile.gpu_class_id,
                "gpus_per_node": 1,
                "tp": 1,
                "nodes": 1,
                "pp": 0,
                "args": '["--max-num-seqs", "8"]',
                "env": '{"STANDIN_LOAD_SECONDS": "3"}',
            }
            said = admin.post(f"/admin/catalog/profile/{profile.pk}/change/", form, follow=True).context[
                "messages"
            ]
            assert any(f"Restart #{op.pk} of {MODEL} is running" in str(m) for m in said), [
                str(m) for m in said
            ]
            op = wait_for_operation(op.pk, timeout=120)
        assert op.state == "succeeded", (op.reason, worker.output())
        now = Profile.objects.get(pk=profile.pk)
        assert (now.revision, now.args) == (profile.revision, profile.args)  # nothing was saved midway
        live = Replica.objects.filter(state="ready", profile=now)
        assert live.count() == 2 and {r.revision for r in live} == {now.revision}
        assert_catalog_is_what_agents_run(fleet)
        assert_nothing_half_done()
