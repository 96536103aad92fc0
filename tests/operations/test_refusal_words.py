"""Refusals name what is in the way (the replica, node or card) and the next step, and change nothing:
a few of the operator's paths (docs/design.md, "Glossary")."""

from __future__ import annotations

import pytest

from audit.models import AuditEntry
from base.actor import Actor, acting_as
from base.errors import DomainError
from catalog.models import Card, Node
from catalog.services.catalog import card_delete
from operations.models import RestartOperation
from operations.services.drain import node_cordon, replica_move_plan
from operations.services.start import restart_start
from tests.support import builders as b

pytestmark = pytest.mark.django_db


def refused(change, **kwargs) -> DomainError:
    """``change`` refused, with nothing written to the audit log."""
    entries = AuditEntry.objects.count()
    with pytest.raises(DomainError) as err, acting_as(Actor(via="cli", name="pytest")):
        change(**kwargs)
    assert AuditEntry.objects.count() == entries
    return err.value


def test_a_restart_naming_a_stopped_replica_says_which_live_ones_to_name():
    n = b.node("gpu-1")
    p = b.profile(b.llama_8b("llama"), "h100")
    b.replica(p, n, [0], name="llama-1")
    b.replica(p, n, [1], name="llama-2")
    b.replica(p, n, [], name="llama-3", state="stopped")
    err = refused(restart_start, model_name="llama", replicas=["llama-3"])
    assert err.code == "not_live"
    assert "Replica llama-3 is stopped" in err.message
    assert "Leave it out: llama's live replicas are llama-1, llama-2." in err.message
    assert not RestartOperation.objects.exists()


def test_a_restart_naming_another_models_replica_says_whose_it_is_and_what_to_do():
    n = b.node("gpu-1")
    b.profile(b.llama_8b("llama"), "h100")
    b.replica(b.profile(b.llama_8b("other"), "h100"), n, [0], name="other-1")
    err = refused(restart_start, model_name="llama", replicas=["other-1"])
    assert err.code == "other_model"
    assert "Replica other-1 serves other, not llama: restart it as other's, or leave it out" in err.message


def test_cordoning_a_down_node_says_how_it_comes_back():
    b.node("gpu-1", state="down")
    err = refused(node_cordon, node_name="gpu-1")
    assert err.code == "not_ready" and err.status == 409
    assert "Node gpu-1 is down, not ready" in err.message
    assert "Uncordon gpu-1 (back to ready) once its agent answers" in err.message
    assert Node.objects.get(name="gpu-1").state == "down"


def test_moving_a_stopping_replica_says_what_it_waits_for():
    n = b.node("gpu-1")
    b.node("gpu-2")
    p = b.profile(b.llama_8b("llama"), "h100")
    b.replica(p, n, [0], name="llama-1", state="stopping")
    err = refused(replica_move_plan, replica_name="llama-1")
    assert err.code == "not_live"
    assert "Replica llama-1 is stopping, not running: there is nothing to move." in err.message
    assert "frees its cards on gpu-1 once it does" in err.message


def test_removing_a_held_card_names_the_replica_and_how_to_free_it():
    n = b.node("gpu-1", cards=2)
    b.replica(b.profile(b.llama_8b("llama"), "h100"), n, [1], name="llama-1")
    card = Card.objects.get(node=n, index=1)
    err = refused(card_delete, instance=card)
    assert err.code == "in_use"
    assert "Card gpu-1#1 is held by replica llama-1: move llama-1 off it" in err.message
    assert "manage.py move_replica llama-1" in err.message
    assert Card.objects.filter(pk=card.pk).exists()
