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
from operations.services.runner import run_operation
from tests.support import builders as b
from tests.support.restart import MODEL, fleet_of

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
    b.node("gpu-1", cards=2)
    response = api(RESTART).post("/api/nodes/gpu-1/drain/")
    assert response.status_code == 202 and response.json()["state"] == "cordoned"
