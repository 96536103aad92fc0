"""The reconciler against real agents: what they run is what the catalog says, every change audited
as the reconciler's, unreachable nodes kept with when they were last seen, orphans listed; and the
page, the API and the command say when a restart has no worker."""

from __future__ import annotations

import os
import signal
import threading
import time
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.db.models import Max
from django.utils import timezone
from rest_framework.test import APIClient

from audit.models import AuditEntry, RowChange
from audit.selectors import changed_outside
from catalog.models import Node, Profile, Replica
from operations.models import RestartOperation, RestartStep
from operations.services.lease import claim
from operations.services.reconcile import Listing, reconcile
from operations.services.runner import run_operation
from operations.services.specs import replica_spec
from operations.services.start import restart_start
from tests.support import builders as b
from tests.support.restart import MODEL, assert_catalog_is_what_agents_run, fleet_of

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("fast_restarts", "audit_flushable"),
]


def reconciler_entries(action: str) -> list[AuditEntry]:
    entries = list(AuditEntry.objects.filter(action=action).order_by("id"))
    assert all((e.actor, e.via) == ("reconciler", "worker") for e in entries), entries
    return entries


def test_an_engine_the_catalog_does_not_hold_is_listed_as_an_orphan_and_audited(tmp_path, actor):
    with fleet_of(tmp_path, nodes=("gpu-a",)) as fleet:
        fleet.start("llama-1", "gpu-a", [0])
        profile = Profile.objects.select_related("model").get(pk=fleet.profile.pk)
        stray = replica_spec(profile, port=fleet.replicas[0].port + 7, cards=[2])
        with fleet.agents["gpu-a"].client() as http:
            assert http.put("/v1/replicas/stray-1", json=stray).status_code == 201
        fleet.agents["gpu-a"].wait_for_state("stray-1", "ready")

        report = reconcile()
        node = Node.objects.get(name="gpu-a")
        assert [o["id"] for o in node.orphans] == ["stray-1"] and node.orphans[0]["cards"] == [2]
        assert report.as_dict()["orphans"] == {"gpu-a": ["stray-1"]}
        (entry,) = reconciler_entries("orphans")
        assert "stray-1" in entry.message and "adopt them in the catalog or stop them" in entry.message
        assert Replica.objects.get(name="llama-1").state == "ready"  # what is in line is left alone
        # Card 2 is free in the catalog and not on the node: placement does not pick it.
        from operations.services.placement import best_fit

        b.replica(
            b.profile(b.llama_8b("filler"), cls=profile.gpu_class), node, [1], name="filler-1", port=8999
        )
        fit = best_fit(Profile.objects.select_related("gpu_class").get(pk=profile.pk))
        assert fit is not None and [c.index for c in fit[1]] == [3]

        reconcile()  # nothing new: nothing written
        assert len(reconciler_entries("orphans")) == 1
        with fleet.agents["gpu-a"].client() as http:
            http.delete("/v1/replicas/stray-1")
        reconcile()
        assert Node.objects.get(name="gpu-a").orphans == []
        assert len(reconciler_entries("orphans")) == 2
        assert_catalog_is_what_agents_run(fleet)


def test_what_an_agent_says_of_its_node_is_kept_on_the_node_audited_once_and_shown_by_the_api(
    tmp_path, actor
):
    with fleet_of(tmp_path, nodes=("gpu-a",)) as fleet:
        assert Node.objects.get(name="gpu-a").facts_at is None  # never reported: not known
        reconcile()
        node = Node.objects.get(name="gpu-a")
        assert node.facts_at is not None
        assert node.engines == {"standin": "0.19.1"}  # as its configuration declares the stand-in
        assert node.arch == os.uname().machine and node.driver_version == ""  # no nvidia-smi here
        (entry,) = reconciler_entries("facts")
        assert "standin 0.19.1" in entry.message and "driver unknown" in entry.message
        reconcile()  # the same facts: nothing written
        assert len(reconciler_entries("facts")) == 1
        client = APIClient()
        client.force_authenticate(b.user("viewer-facts"))
        body = client.get("/api/nodes/gpu-a/").json()
        assert body["engines"] == {"standin": "0.19.1"} and body["arch"] == node.arch
        assert body["driver_version"] == "" and body["facts_at"] is not None
        assert_catalog_is_what_agents_run(fleet)


def test_a_node_whose_agent_does_not_answer_is_unreachable_with_its_last_seen_time_and_replicas_unknown(
    tmp_path, actor, settings
):
    with fleet_of(tmp_path, nodes=("gpu-a", "gpu-b"), processes=True) as fleet:
        fleet.start("llama-1", "gpu-a", [0])
        fleet.start("llama-2", "gpu-b", [0])
        mark = RowChange.objects.aggregate(top=Max("id"))["top"] or 0
        reconcile()
        seen = Node.objects.get(name="gpu-b").last_seen_at
        assert seen is not None

        agent = fleet.agents["gpu-b"]
        os.kill(agent.process.pid, signal.SIGSTOP)  # it hangs: asked within the pass's agent timeout (1 s)
        applied: dict[str, float] = {}
        try:
            began = time.monotonic()
            report = reconcile(
                before_apply=lambda listing: applied.setdefault(listing.node.name, time.monotonic())
            )
            took = time.monotonic() - began
        finally:
            os.kill(agent.process.pid, signal.SIGCONT)
        timeout = settings.LLMGW_RECONCILE_AGENT_TIMEOUT_SECONDS
        assert took < timeout + 2, (
            f"a pass took {took:.1f} s: one hanging agent is bounded by its own timeout"
        )
        # The node that answered was brought in line without waiting for the one that hangs.
        assert applied["gpu-a"] - began < timeout / 2 < applied["gpu-b"] - began, applied
        assert report.as_dict()["unreachable"] == ["gpu-b"]
        node = Node.objects.get(name="gpu-b")
        assert (
            not node.reachable and node.last_seen_at == seen and "did not answer" in node.unreachable_reason
        )
        assert Replica.objects.get(name="llama-2").state == "unknown"
        assert Replica.objects.get(name="llama-2").shards.exists()  # it may run: its card stays held
        assert Replica.objects.get(name="llama-1").state == "ready"
        (entry,) = reconciler_entries("unreachable")
        assert "last seen" in entry.message and entry.object_key == "gpu-b"

        # Placement passes over it while it does not answer.
        from operations.services.placement import best_fit

        fit = best_fit(Profile.objects.select_related("gpu_class").get(pk=fleet.profile.pk))
        assert fit is not None and fit[0].name == "gpu-a"

        reconcile()  # it answers again
        node.refresh_from_db()
        assert node.reachable and node.last_seen_at > seen
        assert Replica.objects.get(name="llama-2").state == "ready"
        assert len(reconciler_entries("reachable")) == 1
        states = [(e.before["state"], e.after["state"]) for e in reconciler_entries("reconcile")]
        assert states == [("ready", "unknown"), ("unknown", "ready")]
        # Every catalog row the passes changed is explained by an audit entry (PostgreSQL records them);
        # the last-seen readings are kept outside the catalog.
        assert not changed_outside().filter(id__gt=mark).exists(), list(
            changed_outside().filter(id__gt=mark).values_list("table_name", "before", "after")
        )
        assert_catalog_is_what_agents_run(fleet)


def test_the_reconcile_command_prints_what_changed_and_exits_1_for_an_unreachable_node(tmp_path, actor):
    with fleet_of(tmp_path, nodes=("gpu-a",)) as fleet:
        fleet.start("llama-1", "gpu-a", [0])
        b.node("gpu-gone", cards=1)  # an agent URL nothing answers on
        Node.objects.filter(name="gpu-gone").update(agent_url="http://127.0.0.1:9")
        out = StringIO()
        with pytest.raises(CommandError) as err:
            call_command("reconcile", stdout=out)
        assert err.value.returncode == 1 and "gpu-gone unreachable" in str(err.value)
        assert (
            "node gpu-gone unreachable" in out.getvalue()
            and "2 node(s) reconciled, 1 unreachable" in out.getvalue()
        )
        out = StringIO()
        call_command("reconcile", "--node", "gpu-a", stdout=out)
        assert "1 node(s) reconciled, 0 unreachable" in out.getvalue()


@pytest.mark.django_db
def test_an_operation_no_worker_holds_is_said_abandoned_on_the_page_the_api_and_the_command(actor, settings):
    node = b.node("gpu-1", cards=2)
    b.replica(b.profile(b.llama_8b(MODEL)), node, [0], name="llama-1")
    op = restart_start(model_name=MODEL, replicas=["llama-1"])
    claim(op.pk, "worker:gone-1")
    assert RestartOperation.objects.get(pk=op.pk).abandoned_text == ""  # its worker beat just now
    RestartOperation.objects.filter(pk=op.pk).update(heartbeat_at=timezone.now() - timedelta(seconds=95))
    op.refresh_from_db()
    assert op.abandoned_text.startswith("abandoned: no worker has it (no heartbeat for 95 s)")
    assert "start a worker (python manage.py db_worker)" in op.abandoned_text

    api = APIClient()
    api.force_authenticate(b.user("vera"))
    body = api.get(f"/api/operations/{op.pk}/").json()
    assert body["state"] == "running" and body["abandoned"].startswith("abandoned: no worker has it")
    assert 94 <= body["abandoned_seconds"] < 120
    api.force_login(b.user("walt"))
    page = api.get(f"/operations/{op.pk}/").content.decode()
    assert "<strong>abandoned: no worker has it (no heartbeat for" in page

    from operations.management.follow import _hint

    err = StringIO()
    from django.core.management.base import OutputWrapper

    assert _hint(op, time.monotonic(), OutputWrapper(err))
    assert f"restart #{op.pk}: abandoned: no worker has it" in err.getvalue()
    assert "python manage.py db_worker" in err.getvalue()


def test_a_restart_that_finishes_while_a_pass_is_held_between_listing_and_applying_keeps_its_replica_ready(
    tmp_path, actor
):
    """The race of issue 23: a pass asks the agents, a restart then starts and finishes a
    replacement (which the listings cannot know) and stops the old replica (which they still show
    running), and only then is the pass applied. It leaves both as the restart recorded them."""
    with fleet_of(tmp_path, nodes=("gpu-a", "gpu-b")) as fleet:
        fleet.start("llama-1", "gpu-a", [0])
        listings: list[Listing] = []
        listed, go = threading.Event(), threading.Event()
        report: list[Any] = []

        def hold(listing: Listing) -> None:  # the seam between a listing and its application
            listings.append(listing)
            listed.set()
            assert go.wait(timeout=60)

        def a_pass() -> None:
            try:
                report.append(reconcile(before_apply=hold))
            finally:
                connection.close()

        passing = threading.Thread(target=a_pass)
        passing.start()
        try:
            assert listed.wait(timeout=10)
            op = restart_start(model_name=MODEL, replicas=["llama-1"], in_place=False, settle_seconds=0)
            assert run_operation(op.pk) == "succeeded"
        finally:
            go.set()
            passing.join(timeout=30)
        assert not passing.is_alive() and report

        (step,) = RestartStep.objects.filter(operation=op)
        new = Replica.objects.get(pk=step.new_replica_id)
        # The premise: every listing was asked before the replacement was even recorded.
        assert len(listings) == 2 and all(listing.asked_at < step.started_at for listing in listings)
        held = [str(s.card) for s in new.shards.select_related("card__node")]
        assert new.state == "ready" and held == [f"{step.node}#{i}" for i in step.cards]
        old = Replica.objects.get(name="llama-1")
        assert old.state == "stopped" and not old.shards.exists()
        # The pass wrote nothing of either, and saw no orphan in the old replica its listing still showed.
        assert not AuditEntry.objects.filter(action="reconcile").exists()
        # (the pass's first word with the agent keeps what it says of its node: no replica's change)
        changes = [c for c in report[0].as_dict()["changes"] if " facts: " not in c]
        assert Node.objects.get(name="gpu-a").orphans == [] and changes == []

        reconcile()  # a pass that asks now agrees with the restart
        assert Replica.objects.get(pk=new.pk).state == "ready"
        assert_catalog_is_what_agents_run(fleet)


def test_a_card_the_agent_shows_another_engine_on_is_not_freed_though_the_replica_recorded_there_is_gone(
    tmp_path, actor
):
    with fleet_of(tmp_path, nodes=("gpu-a",)) as fleet:
        fleet.start("llama-1", "gpu-a", [0])
        profile = Profile.objects.select_related("model").get(pk=fleet.profile.pk)
        # The agent runs an engine on card 1 that the catalog does not hold; the catalog says card 1 is
        # llama-9's, which the agent does not know.
        stray = replica_spec(profile, port=fleet.replicas[0].port + 7, cards=[1])
        with fleet.agents["gpu-a"].client() as http:
            assert http.put("/v1/replicas/stray-1", json=stray).status_code == 201
        fleet.agents["gpu-a"].wait_for_state("stray-1", "ready")
        b.replica(profile, Node.objects.get(name="gpu-a"), [1], name="llama-9", port=8999)

        report = reconcile()
        ghost = Replica.objects.get(name="llama-9")
        assert ghost.state == "ready" and ghost.shards.count() == 1  # card 1 stays held: it is not free
        assert any(
            "llama-9: not freed: its agent runs another engine on gpu-a#1" in c
            for c in report.as_dict()["changes"]
        )
        assert not AuditEntry.objects.filter(action="reconcile", object_key="llama-9").exists()
        assert [o["id"] for o in Node.objects.get(name="gpu-a").orphans] == ["stray-1"]
