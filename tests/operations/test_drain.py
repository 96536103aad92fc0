"""Cordon, drain and uncordon a node, and move one replica: from the API and the commands, as
restart operations planned off the node, all or nothing, audited; refusals change nothing."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from rest_framework.test import APIClient

from audit.models import AuditEntry
from base.actor import Actor, acting_as
from catalog.models import Node, Replica
from operations.models import RestartOperation
from operations.services.reconcile import reconcile
from operations.services.runner import run_operation
from tests.support import builders as b
from tests.support.restart import (
    MODEL,
    assert_catalog_is_what_agents_run,
    fleet_of,
    kill_agent,
    respawn_agent,
)

RESTART = "catalog.restart_model"


def api(*perms: str) -> APIClient:
    client = APIClient()
    client.force_authenticate(b.user(f"ops-{len(perms)}-{id(client)}", *perms))
    return client


@pytest.mark.django_db
def test_cordon_and_uncordon_are_audited_and_a_second_cordon_is_refused_with_nothing_written():
    b.node("gpu-1", cards=2)
    client = api(RESTART)
    response = client.post("/api/nodes/gpu-1/cordon/")
    assert response.status_code == 200 and response.json() == {"node": "gpu-1", "state": "cordoned"}
    entry = AuditEntry.objects.get(action="cordon")
    assert (entry.object_type, entry.object_key, entry.before, entry.after) == (
        "node",
        "gpu-1",
        {"state": "ready"},
        {"state": "cordoned"},
    )
    again = client.post("/api/nodes/gpu-1/cordon/")
    assert again.status_code == 409 and again.json()["code"] == "not_ready"
    assert "uncordon it" in again.json()["detail"]
    assert AuditEntry.objects.count() == 1
    assert client.post("/api/nodes/gpu-1/uncordon/").json()["state"] == "ready"
    assert client.post("/api/nodes/gpu-1/uncordon/").json()["code"] == "not_cordoned"
    assert AuditEntry.objects.filter(action="uncordon").count() == 1


@pytest.mark.django_db
def test_without_the_restart_permission_a_drain_is_refused_and_nothing_changes():
    n = b.node("gpu-1", cards=2)
    b.replica(b.profile(b.llama_8b(MODEL)), n, [0], name="llama-1")
    assert api().post("/api/nodes/gpu-1/drain/").status_code == 403
    assert Node.objects.get(name="gpu-1").state == "ready" and not AuditEntry.objects.exists()


@pytest.mark.django_db
def test_a_drain_with_no_room_elsewhere_is_refused_whole_and_the_node_is_left_ready():
    here = b.node("gpu-1", cards=4)
    b.node("gpu-2", cards=1)  # room for one of the two replicas only
    p = b.profile(b.llama_8b(MODEL))
    b.replica(p, here, [0], name="llama-1")
    b.replica(p, here, [1], name="llama-2")
    response = api(RESTART).post("/api/nodes/gpu-1/drain/", {}, format="json")
    assert response.status_code == 409 and response.json()["code"] == "no_room_beside", response.json()
    assert Node.objects.get(name="gpu-1").state == "ready"
    assert not RestartOperation.objects.exists() and not AuditEntry.objects.exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("fast_restarts", "audit_flushable")
def test_the_drain_command_moves_every_replica_off_the_node_and_leaves_it_cordoned(tmp_path):
    with fleet_of(tmp_path, nodes=("gpu-a", "gpu-b"), cards=4) as fleet:
        fleet.start("llama-1", "gpu-a", [0])
        fleet.start("llama-2", "gpu-a", [1])
        out = StringIO()
        call_command("drain", "gpu-a", "--no-wait", "--as", "ops-bot", stdout=out, stderr=StringIO())
        op = RestartOperation.objects.get()
        assert f"restart #{op.pk} of {MODEL} queued: drain of gpu-a: llama-1, llama-2" in out.getvalue()
        assert [s.planned_node for s in op.steps.all()] == ["gpu-b", "gpu-b"]
        assert run_operation(op.pk) == "succeeded"
        assert Node.objects.get(name="gpu-a").state == "cordoned"
        assert not Replica.objects.filter(state="ready", shards__card__node__name="gpu-a").exists()
        assert fleet.ready_on_agents() == {"gpu-a": 0, "gpu-b": 2}
        assert AuditEntry.objects.get(action="cordon").actor == "ops-bot"
        with pytest.raises(CommandError) as err:
            call_command("cordon", "gpu-a", stdout=StringIO(), stderr=StringIO())
        assert err.value.returncode == 1 and "[not_ready]" in str(err.value)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("fast_restarts", "audit_flushable")
def test_a_replica_moved_over_the_api_goes_to_another_node_though_its_own_has_free_cards(tmp_path):
    with fleet_of(tmp_path, nodes=("gpu-a", "gpu-b"), cards=4) as fleet:
        fleet.start("llama-1", "gpu-a", [0])
        response = api(RESTART).post("/api/replicas/llama-1/move/", {"ready_timeout": 30}, format="json")
        assert response.status_code == 202, response.json()
        body = response.json()
        assert body["cause"] == "move of llama-1 off gpu-a" and body["in_place"] is False
        assert run_operation(body["id"]) == "succeeded"
        new = RestartOperation.objects.get().steps.get().new_replica
        assert list(new.shards.values_list("card__node__name", flat=True)) == ["gpu-b"]
        assert Replica.objects.get(name="llama-1").state == "stopped"
        stopped = api(RESTART).post("/api/replicas/llama-1/move/", {}, format="json")
        assert stopped.status_code == 400 and stopped.json()["code"] == "not_live"


@pytest.mark.django_db
def test_a_cordoned_node_is_said_so_where_the_model_page_names_it():
    from django.test import Client

    from operations.services.drain import node_cordon

    n = b.node("gpu-1", cards=2)
    b.replica(b.profile(b.llama_8b(MODEL)), n, [0], name="llama-1")
    client = Client()
    client.force_login(b.user("viewer"))
    assert 'badge state-cordoned">cordoned' not in client.get(f"/models/{MODEL}/").content.decode()
    with acting_as(Actor(via="cli", name="pytest")):
        node_cordon(node_name="gpu-1")
    page = client.get(f"/models/{MODEL}/").content.decode()
    assert '>gpu-1</a> <span class="badge state-cordoned">cordoned</span>' in page
    assert "Cordoned: no new replica is placed on gpu-1" in client.get("/nodes/gpu-1/").content.decode()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("body", "content_type", "status"),
    [
        ('{"max_parallel": 2, "bogus": 1}', "application/json", 400),  # an unknown key
        ('{"max_parallel": "2"}', "application/json", 400),  # a wrong type
        ('{"max_parallel": 2.0}', "application/json", 400),
        ('{"ready_timeout": true}', "application/json", 400),
        ('{"max_parallel": null}', "application/json", 400),
        ('{"max_parallel": 0}', "application/json", 400),
        ("[]", "application/json", 400),
        ("null", "application/json", 400),
        ("{oops", "application/json", 400),
        ("max_parallel=2", "application/x-www-form-urlencoded", 415),  # no numbers in a form
        (
            '--x\r\nContent-Disposition: form-data; name="max_parallel"\r\n\r\n2\r\n--x--\r\n',
            "multipart/form-data; boundary=x",
            415,
        ),
    ],
)
def test_a_malformed_drain_body_is_refused_in_the_error_shape_and_nothing_is_drained(
    body, content_type, status
):
    n = b.node("gpu-1", cards=2)
    b.node("gpu-2", cards=2)
    b.replica(b.profile(b.llama_8b(MODEL)), n, [0], name="llama-1")
    response = api(RESTART).generic("POST", "/api/nodes/gpu-1/drain/", body, content_type=content_type)
    assert response.status_code == status, response.content
    assert set(response.json()) == {"detail", "code"} and response.json()["detail"]
    assert Node.objects.get(name="gpu-1").state == "ready"
    assert not RestartOperation.objects.exists() and not AuditEntry.objects.exists()


@pytest.mark.django_db
def test_a_drain_without_a_body_takes_the_defaults():
    """No body (whatever content type a client names for it, as DRF's test client names multipart)."""
    n = b.node("gpu-1", cards=2)
    b.node("gpu-2", cards=2)
    b.replica(b.profile(b.llama_8b(MODEL)), n, [0], name="llama-1")
    response = api(RESTART).post("/api/nodes/gpu-1/drain/")
    assert response.status_code == 202 and response.json()["state"] == "cordoned"
    (op,) = response.json()["operations"]
    assert op["max_parallel"] == 1 and op["ready_timeout"] == 600


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("fast_restarts", "audit_flushable")
def test_a_drain_of_a_node_whose_agent_is_down_moves_its_unknown_replicas_and_its_dry_run_lists_them(
    tmp_path,
):
    with fleet_of(tmp_path, nodes=("gpu-a", "gpu-b"), cards=4, processes=True) as fleet:
        fleet.start("llama-1", "gpu-a", [0])
        fleet.start("llama-2", "gpu-a", [1])
        kill_agent(fleet.agents["gpu-a"])
        reconcile()
        assert set(
            Replica.objects.filter(name__in=["llama-1", "llama-2"]).values_list("state", flat=True)
        ) == {"unknown"}
        entries = AuditEntry.objects.count()

        # The dry run: where each would go, nothing changed, nothing audited.
        plan = api(RESTART).post("/api/nodes/gpu-a/drain/", {"dry_run": True}, format="json")
        assert plan.status_code == 200, plan.json()
        moves = plan.json()["moves"]
        assert [(m["replica"], m["state"], m["from_node"], m["to_node"]) for m in moves] == [
            ("llama-1", "unknown", "gpu-a", "gpu-b"),
            ("llama-2", "unknown", "gpu-a", "gpu-b"),
        ]
        assert sorted(c for m in moves for c in m["to_cards"]) == [0, 1]
        out = StringIO()
        call_command("drain", "gpu-a", "--dry-run", stdout=out, stderr=StringIO())
        assert "llama-1 (llama, unknown): gpu-a cards 0 → gpu-b cards" in out.getvalue()
        assert AuditEntry.objects.count() == entries and not RestartOperation.objects.exists()
        assert Node.objects.get(name="gpu-a").state == "ready"

        # The drain: it answers with the operation that moves them.
        response = api(RESTART).post("/api/nodes/gpu-a/drain/", {}, format="json")
        assert response.status_code == 202, response.json()
        (op,) = response.json()["operations"]
        assert "llama-1, llama-2 unknown" in op["cause"]
        assert run_operation(op["id"]) == "succeeded"
        moved = RestartOperation.objects.get(pk=op["id"]).steps.order_by("id")
        for step in moved:
            assert step.new_replica.state == "ready"
            assert list(step.new_replica.shards.values_list("card__node__name", flat=True)) == ["gpu-b"]
            # Its agent never confirmed the stop: the old replica keeps its card until it does.
            old = Replica.objects.get(pk=step.old_replica_id)
            assert old.state == "stopping" and old.shards.exists()
        with fleet.agents["gpu-b"].client(timeout=5) as http:
            assert sum(r["state"] == "ready" for r in http.get("/v1/replicas").json()) == 2

        respawn_agent(fleet.agents["gpu-a"])  # it answers again: the reconciler stops the old ones
        reconcile()
        assert set(
            Replica.objects.filter(name__in=["llama-1", "llama-2"]).values_list("state", flat=True)
        ) == {"stopped"}
        assert_catalog_is_what_agents_run(fleet)


@pytest.mark.django_db
def test_a_drain_of_a_node_that_runs_nothing_is_refused_saying_so_and_changes_nothing(client):
    b.node("gpu-1", cards=2)
    response = api(RESTART).post("/api/nodes/gpu-1/drain/", {}, format="json")
    assert response.status_code == 409 and response.json()["code"] == "nothing_to_drain", response.json()
    assert "no drain was started" in response.json()["detail"]
    assert api(RESTART).post("/api/nodes/gpu-1/drain/", {"dry_run": True}, format="json").status_code == 409
    assert Node.objects.get(name="gpu-1").state == "ready" and not AuditEntry.objects.exists()
    client.force_login(b.user("ops", RESTART))
    page = client.get("/nodes/gpu-1/drain/preview/")
    assert page.status_code == 200 and "runs no replica that can be moved" in page.content.decode()
    assert 'action="/nodes/gpu-1/drain/"' not in page.content.decode()  # nothing to confirm


@pytest.mark.django_db
def test_the_node_page_shows_where_a_drain_would_move_each_replica_before_it_drains(client):
    here = b.node("gpu-1", cards=2)
    b.node("gpu-2", cards=2)
    b.replica(b.profile(b.llama_8b(MODEL)), here, [0], name="llama-1")
    client.force_login(b.user("ops", RESTART))
    node_page = client.get("/nodes/gpu-1/").content.decode()
    assert (
        'action="/nodes/gpu-1/drain/preview/"' in node_page
        and 'action="/nodes/gpu-1/drain/"' not in node_page
    )
    preview = client.get("/nodes/gpu-1/drain/preview/").content.decode()
    assert "llama-1" in preview and "gpu-2 card 0" in preview and 'action="/nodes/gpu-1/drain/"' in preview
    assert Node.objects.get(name="gpu-1").state == "ready" and not AuditEntry.objects.exists()
    client.post("/nodes/gpu-1/drain/")
    assert Node.objects.get(name="gpu-1").state == "cordoned"
    assert RestartOperation.objects.get().steps.get().planned_node == "gpu-2"


@pytest.mark.django_db
def test_a_move_goes_to_the_node_chosen_and_its_dry_run_says_where_first(client):
    here = b.node("gpu-1", cards=2)
    b.node("gpu-2", cards=2)
    b.node("gpu-3", cards=2)
    b.replica(b.profile(b.llama_8b(MODEL)), here, [0], name="llama-1")
    plan = api(RESTART).post(
        "/api/replicas/llama-1/move/", {"to_node": "gpu-3", "dry_run": True}, format="json"
    )
    assert plan.status_code == 200 and (plan.json()["to_node"], plan.json()["to_cards"]) == ("gpu-3", [0])
    out = StringIO()
    call_command("move_replica", "llama-1", "--to", "gpu-3", "--dry-run", stdout=out, stderr=StringIO())
    assert "gpu-1 cards 0 → gpu-3 cards 0" in out.getvalue()
    assert not AuditEntry.objects.exists() and not RestartOperation.objects.exists()

    client.force_login(b.user("ops", RESTART))
    page = client.get("/replicas/llama-1/").content.decode()
    assert '<option value="gpu-2">' in page and '<option value="gpu-3">' in page
    assert '<option value="gpu-1">' not in page
    preview = client.get("/replicas/llama-1/move/preview/?to=gpu-3").content.decode()
    assert "gpu-3 card 0" in preview and 'name="to" value="gpu-3"' in preview

    own = api(RESTART).post("/api/replicas/llama-1/move/", {"to_node": "gpu-1"}, format="json")
    assert (
        own.status_code == 409 and own.json()["code"] == "wrong_node" and "own node" in own.json()["detail"]
    )
    client.post("/replicas/llama-1/move/", {"to": "gpu-3"})
    step = RestartOperation.objects.get().steps.get()
    assert step.planned_node == "gpu-3" and "to gpu-3" in step.operation.cause
    assert AuditEntry.objects.filter(action="restart_start").count() == 1


@pytest.mark.django_db
def test_a_move_where_no_other_node_of_its_class_exists_is_not_offered_and_is_refused_saying_why(client):
    here = b.node("gpu-1", cards=4)
    b.node("a100-1", cards=4, cls=b.gpu_class("a100-80g"))
    b.replica(b.profile(b.llama_8b(MODEL)), here, [0], name="llama-1")
    for body in ({}, {"dry_run": True}):
        response = api(RESTART).post("/api/replicas/llama-1/move/", body, format="json")
        assert response.status_code == 409 and response.json()["code"] == "no_other_node", response.json()
        detail = response.json()["detail"]
        assert "gpu-1 is the only node with h100-80g cards" in detail and "in place" not in detail
    client.force_login(b.user("ops", RESTART))
    assert "move-form" not in client.get("/replicas/llama-1/").content.decode()
    assert not AuditEntry.objects.exists() and not RestartOperation.objects.exists()


@pytest.mark.django_db
def test_a_move_to_a_full_node_is_refused_naming_it_and_not_in_place():
    here = b.node("gpu-1", cards=2)
    full = b.node("gpu-2", cards=1)
    p = b.profile(b.llama_8b(MODEL))
    b.replica(p, here, [0], name="llama-1")
    b.replica(p, full, [0], name="llama-2", port=8001)
    response = api(RESTART).post("/api/replicas/llama-1/move/", {"to_node": "gpu-2"}, format="json")
    assert response.status_code == 409 and response.json()["code"] == "no_room", response.json()
    assert "gpu-2 has not 1 h100-80g card free" in response.json()["detail"]
    assert "in place" not in response.json()["detail"]
    assert not AuditEntry.objects.exists()
