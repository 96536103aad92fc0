"""A card cordoned on its own: from the API, the node page and the commands, and by the telemetry when
an agent reports uncorrected ECC errors; audited on every path; placement passes it over; refusals
change nothing."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client
from rest_framework.test import APIClient

from audit.models import AuditEntry
from base.actor import Actor, acting_as
from base.errors import DomainError
from catalog.models import Card
from catalog.services.cards import card_cordon
from operations.models import RestartOperation
from operations.selectors import rooms_and_fleet
from operations.services.placement import best_fit, in_place_cards
from operations.services.start import restart_plan, restart_start
from telemetry.services import telemetry_record
from tests.support import builders as b

RESTART = "catalog.restart_model"
pytestmark = pytest.mark.django_db


def api(*perms: str) -> APIClient:
    client = APIClient()
    client.force_authenticate(b.user(f"ops-{len(perms)}", *perms))
    return client


def cordoned(node: str, index: int) -> tuple[bool, str]:
    card = Card.objects.get(node__name=node, index=index)
    return card.cordoned, card.cordon_reason


def test_a_card_is_cordoned_and_uncordoned_over_the_api_audited_and_a_second_cordon_is_refused():
    b.node("gpu-1", cards=4)
    client = api(RESTART)
    response = client.post("/api/nodes/gpu-1/cards/2/cordon/", {"reason": "Xid 79"}, format="json")
    assert response.status_code == 200, response.json()
    assert response.json() == {"node": "gpu-1", "index": 2, "cordoned": True, "cordon_reason": "Xid 79"}
    assert cordoned("gpu-1", 2) == (True, "Xid 79") and cordoned("gpu-1", 1) == (False, "")
    entry = AuditEntry.objects.get(action="cordon")
    assert (entry.object_type, entry.object_key, entry.via) == ("card", "gpu-1#2", "api")
    assert (entry.before, entry.after) == (
        {"cordoned": False, "cordon_reason": ""},
        {"cordoned": True, "cordon_reason": "Xid 79"},
    )

    again = client.post("/api/nodes/gpu-1/cards/2/cordon/", {"reason": "other"}, format="json")
    assert again.status_code == 409 and again.json()["code"] == "card_cordoned"
    assert "uncordon it first" in again.json()["detail"]
    assert (
        cordoned("gpu-1", 2) == (True, "Xid 79") and AuditEntry.objects.filter(action="cordon").count() == 1
    )

    assert client.post("/api/nodes/gpu-1/cards/2/uncordon/").json()["cordoned"] is False
    assert client.post("/api/nodes/gpu-1/cards/2/uncordon/").json()["code"] == "card_not_cordoned"
    assert AuditEntry.objects.filter(action="uncordon", object_type="card").count() == 1


def test_bad_input_is_refused_saying_why_and_writes_nothing():
    b.node("gpu-1", cards=2)
    client = api(RESTART)
    missing = client.post("/api/nodes/gpu-1/cards/7/cordon/", {}, format="json")
    assert missing.status_code == 404 and "its cards are 0, 1" in missing.json()["detail"]
    unknown = client.post("/api/nodes/gpu-1/cards/0/cordon/", {"why": "x"}, format="json")
    assert unknown.status_code == 400 and "unknown field(s) why" in unknown.json()["detail"]
    assert client.post("/api/nodes/gpu-9/cards/0/cordon/", {}, format="json").status_code == 404
    assert api().post("/api/nodes/gpu-1/cards/0/cordon/", {}, format="json").status_code == 403
    assert not Card.objects.filter(cordoned=True).exists() and not AuditEntry.objects.exists()


def test_the_commands_cordon_and_uncordon_a_card_and_exit_1_when_refused():
    b.node("gpu-1", cards=2)
    out = StringIO()
    call_command(
        "cordon_card", "gpu-1", "1", "--reason", "ECC", "--as", "ops-bot", stdout=out, stderr=StringIO()
    )
    assert "card 1 of gpu-1 is cordoned" in out.getvalue()
    assert cordoned("gpu-1", 1) == (True, "ECC")
    entry = AuditEntry.objects.get(action="cordon")
    assert (entry.actor, entry.via) == ("ops-bot", "cli")
    with pytest.raises(CommandError) as err:
        call_command("cordon_card", "gpu-1", "1", stdout=StringIO(), stderr=StringIO())
    assert err.value.returncode == 1 and "[card_cordoned]" in str(err.value)
    call_command("uncordon_card", "gpu-1", "1", stdout=StringIO(), stderr=StringIO())
    assert cordoned("gpu-1", 1) == (False, "")


def test_the_node_page_cordons_a_card_and_draws_it_cordoned():
    b.node("gpu-1", cards=2)
    operator = Client()
    operator.force_login(b.user("operator", RESTART))
    page = operator.get("/nodes/gpu-1/").content.decode()
    assert 'action="/nodes/gpu-1/cards/cordon/"' in page
    response = operator.post("/nodes/gpu-1/cards/cordon/", {"index": "0", "reason": "Xid 48"})
    assert response.status_code == 303
    assert cordoned("gpu-1", 0) == (True, "Xid 48")
    assert AuditEntry.objects.get(action="cordon").via == "ui"
    page = operator.get("/nodes/gpu-1/").content.decode()
    assert "Card 0 of gpu-1 cordoned." in page and "Card 0 is cordoned (Xid 48)." in page
    assert 'class="card cordoned-card"' in page and "cordoned: Xid 48" in page
    assert "Uncordon card 0" in page and ">1 free<" in page  # card 1 only
    assert "No node matches these filters." in operator.get("/nodes/?free=2").content.decode()
    assert "1 node matches" in operator.get("/nodes/?free=1").content.decode()
    viewer = Client()
    viewer.force_login(b.user("viewer"))
    assert "Cordon this card" not in viewer.get("/nodes/gpu-1/").content.decode()


def test_placement_passes_a_cordoned_card_over():
    one = b.node("gpu-1", cards=2)
    b.node("gpu-2", cards=2)
    profile = b.profile(b.llama_8b("llama"), "h100")
    old = b.replica(profile, one, [0], name="llama-1")
    with acting_as(Actor(via="cli", name="pytest")):
        card_cordon(node_name="gpu-1", index=1, reason="Xid 79")
        card_cordon(node_name="gpu-2", index=0)
    node, cards = best_fit(profile)
    assert (node.name, [c.index for c in cards]) == ("gpu-2", [1])
    rooms, _ = rooms_and_fleet(profile)
    assert {(r.node, r.free) for r in rooms} == {("gpu-1", 0), ("gpu-2", 1)}
    assert in_place_cards(profile, old, one) == [0]  # its own card; not card 1
    with acting_as(Actor(via="cli", name="pytest")):
        card_cordon(node_name="gpu-2", index=1)
    assert best_fit(profile) is None


def test_a_restart_in_place_does_not_plan_onto_its_replicas_own_cordoned_card():
    """The plan (and so the dry run and the start) treats a cordoned card the replica holds as one no
    replacement takes, as the runner does (``in_place_cards``): in place on its other cards where it
    has some, else refused naming the card and what to do, before anything starts."""
    one = b.node("gpu-1", cards=2)
    profile = b.profile(b.llama_8b("llama"), "h100")
    b.replica(profile, one, [0], name="llama-1")
    with acting_as(Actor(via="cli", name="pytest")):
        card_cordon(node_name="gpu-1", index=0, reason="Xid 79")
    plan = restart_plan(model_name="llama", replicas=["llama-1"], in_place=True)
    (place,) = plan.places.values()
    assert (place.node, place.cards, place.in_place) == ("gpu-1", (1,), True)  # its free card, not card 0

    b.replica(b.profile(b.llama_8b("other"), "h100"), one, [1], name="other-1")
    with pytest.raises(DomainError) as refused:
        restart_plan(model_name="llama", replicas=["llama-1"], in_place=True)
    assert refused.value.code == "no_room" and refused.value.status == 409
    said = refused.value.message
    assert "llama-1 has no place" in said and "card 0 of gpu-1 is cordoned" in said, said
    assert "Uncordon card 0 of gpu-1 if it is sound" in said, said
    # Refused before it started: no restart, nothing audited.
    entries = AuditEntry.objects.count()
    with pytest.raises(DomainError), acting_as(Actor(via="cli", name="pytest")):
        restart_start(model_name="llama", replicas=["llama-1"], in_place=True)
    assert not RestartOperation.objects.exists() and AuditEntry.objects.count() == entries


def test_a_card_whose_agent_reports_uncorrected_ecc_errors_is_cordoned_once_audited():
    node = b.node("gpu-1", cards=2)
    body = {
        "source": "nvidia-smi",
        "cards": [
            {
                "index": 0,
                "memory_used_mib": 0,
                "memory_total_mib": 81559,
                "ecc_uncorrected": 0,
                "processes": [],
            },
            {
                "index": 1,
                "memory_used_mib": 0,
                "memory_total_mib": 81559,
                "ecc_uncorrected": 2,
                "processes": [],
            },
        ],
    }
    with acting_as(Actor(via="worker", name="worker:test")):
        telemetry_record(node=node, body=body)
        telemetry_record(node=node, body=body)  # sampled again: already cordoned, nothing more
    assert cordoned("gpu-1", 0) == (False, "")
    flag, reason = cordoned("gpu-1", 1)
    assert flag and reason.startswith("2 uncorrected ECC errors since its driver loaded")
    entry = AuditEntry.objects.get(action="cordon")
    assert (entry.object_key, entry.actor, entry.via) == ("gpu-1#1", "worker:test", "worker")
