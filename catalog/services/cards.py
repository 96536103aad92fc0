"""A card taken out of placement on its own: a bad card (Xid or ECC errors) need not cost its whole
node. ``card_cordon`` and ``card_uncordon`` are the only writers of ``Card.cordoned`` (the node page,
the API, the commands, and the telemetry when an agent reports uncorrected ECC errors); placement
passes a cordoned card over (operations/services/placement.py, operations/selectors.py). What runs
on it keeps running: move it to take the card out of use."""

from __future__ import annotations

from django.db import transaction

from audit.services import audit_record
from base.actor import Actor, current_actor
from base.errors import DomainError, conflict, not_found
from catalog.models import Card, Node


def _card(node_name: str, index: int) -> Card:
    card = (
        Card.objects.select_for_update()
        .select_related("node")
        .filter(node__name=node_name, index=index)
        .first()
    )
    if card is None:
        if not Node.objects.filter(name=node_name).exists():
            raise not_found(f"No node {node_name!r} in the catalog.")
        raise not_found(
            f"Node {node_name} has no card {index}: its cards are "
            f"{', '.join(str(i) for i in Card.objects.filter(node__name=node_name).values_list('index', flat=True)) or 'none'}."
        )
    return card


def _set_card(card: Card, cordoned: bool, reason: str, *, action: str, message: str, actor: Actor) -> None:
    before = {"cordoned": card.cordoned, "cordon_reason": card.cordon_reason}
    card.cordoned, card.cordon_reason = cordoned, reason
    card.save(update_fields=["cordoned", "cordon_reason"])
    audit_record(
        action=action,
        object_type="card",
        object_key=str(card),
        object_repr=str(card),
        before=before,
        after={"cordoned": cordoned, "cordon_reason": reason},
        message=message,
        actor=actor,
    )


CORDON_REASON_MAX = 300


def card_cordon(*, node_name: str, index: int, reason: str = "", actor: Actor | None = None) -> Card:
    """No new replica is placed on this one card (a bad card: Xid or ECC errors); what runs on it
    keeps running, and the rest of its node takes placements. Refused when it already is."""
    actor = actor or current_actor()
    reason = " ".join(reason.split())
    if len(reason) > CORDON_REASON_MAX:
        raise DomainError(
            "invalid", f"The reason is {len(reason)} characters: say it in at most {CORDON_REASON_MAX}."
        )
    with transaction.atomic():
        card = _card(node_name, index)
        if card.cordoned:
            raise conflict(
                "card_cordoned",
                f"Card {index} of {node_name} is already cordoned ({card.cordon_reason or 'no reason given'}): "
                "uncordon it first to change why.",
            )
        _set_card(
            card,
            True,
            reason,
            action="cordon",
            message=f"cordoned card {index} of {node_name}: no new placements on it"
            + (f" ({reason})" if reason else ""),
            actor=actor,
        )
    return card


def card_uncordon(*, node_name: str, index: int, actor: Actor | None = None) -> Card:
    """The card takes placements again. Refused when it is not cordoned."""
    actor = actor or current_actor()
    with transaction.atomic():
        card = _card(node_name, index)
        if not card.cordoned:
            raise conflict(
                "card_not_cordoned", f"Card {index} of {node_name} is not cordoned: nothing to uncordon."
            )
        _set_card(
            card,
            False,
            "",
            action="uncordon",
            message=f"uncordoned card {index} of {node_name}: placements on it again",
            actor=actor,
        )
    return card
