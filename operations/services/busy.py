"""While a restart of a model is queued or running, nothing may change what it runs.

``refuse_while_restarting`` is the one check, public so that every write path
calls the same one: profile saves (admin, API, the cluster settings file, the
resize and context operations through ``profile_save``), the resize and
context operations themselves (before they plan, so a dry run says so too),
and any later operation that changes what a model runs (a rollback). A
restart picks up the profile's revision step by step: a change in the middle
would leave some replicas on one revision and some on another, and the
operation's outcome would not say so.
"""

from __future__ import annotations

from typing import Any

from django.urls import reverse

from base.errors import DomainError, conflict
from operations.models import RestartOperation


def active_restart(model_id: int) -> RestartOperation | None:
    """The model's queued or running restart, if any (at most one: a constraint says so)."""
    return (
        RestartOperation.objects.filter(model_id=model_id, state__in=RestartOperation.ACTIVE_STATES)
        .select_related("model")
        .first()
    )


def busy_refusal(op: RestartOperation, *, doing: str, change: dict[str, Any] | None = None) -> DomainError:
    """The ``busy`` refusal, naming the operation and where to watch or cancel it."""
    link = reverse("operation-detail", args=[op.pk])
    return conflict(
        "busy",
        f"Restart #{op.pk} of {op.model.name} is {op.state.replace('_', ' ')} ({link}): {doing} now would "
        "change what it runs halfway through. Wait until it ends, or cancel it, then try again.",
        change=change,
    )


def refuse_while_restarting(model_id: int, *, doing: str, change: dict[str, Any] | None = None) -> None:
    """Raise ``busy`` (409) when a restart of the model is queued or running.

    ``doing`` says what was refused, in the operator's words ("saving the
    profile", "resizing llama"); ``change`` is the part of a change worked out
    before the refusal, returned beside it.
    """
    op = active_restart(model_id)
    if op is not None:
        raise busy_refusal(op, doing=doing, change=change)
