"""A group's planned places are taken at its step only while every card is still free, as a one-node
replacement's are (runner/rolling.py ``_planned_cards``): a card a foreign process or an orphan
engine took since the plan sends the step to the group's best fit instead."""

from __future__ import annotations

import pytest
from django.utils import timezone

from catalog.models import Card, Node, Profile
from operations.services.runner.group_steps import _planned_fit
from telemetry.models import CardReading
from tests.support import builders as b

pytestmark = pytest.mark.django_db

PLANNED = [{"rank": 0, "node": "gpu-a", "cards": [0, 1]}, {"rank": 1, "node": "gpu-b", "cards": [0, 1]}]


def two_node_profile() -> Profile:
    for name in ("gpu-a", "gpu-b"):
        b.node(name, cards=2)
    Node.objects.update(fabric_domain="ib-1")
    return b.profile(b.llama_8b(), gpus=2, nodes=2, pp=2)


def test_planned_places_still_free_are_taken():
    profile = two_node_profile()
    fit = _planned_fit(profile, PLANNED)
    assert fit is not None
    assert [(rank, node.name, [c.index for c in cards]) for rank, node, cards in fit] == [
        (0, "gpu-a", [0, 1]),
        (1, "gpu-b", [0, 1]),
    ]


def test_a_planned_card_a_foreign_process_took_since_the_plan_is_not_taken():
    profile = two_node_profile()
    card = Card.objects.get(node__name="gpu-b", index=1)
    CardReading.objects.create(card=card, at=timezone.now(), foreign_mib=4096)
    assert _planned_fit(profile, PLANNED) is None


def test_a_planned_card_an_orphan_engine_runs_on_is_not_taken():
    profile = two_node_profile()
    Node.objects.filter(name="gpu-b").update(
        orphans=[{"id": "stray", "state": "ready", "port": 9000, "cards": [0], "pid": 1}]
    )
    assert _planned_fit(profile, PLANNED) is None
