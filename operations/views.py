"""Restart operations: the list, a page per operation (live while it runs), cancel.

The progress fragment polls itself every second while the operation is queued
or running, and comes back without its trigger once it has ended, which stops
the polling. The cancel button sits outside the polled fragment so that the
poll never takes the keyboard focus away from it; the fragment updates it
out of band.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from django.contrib import messages
from django.core.paginator import Paginator
from django.db.models import Count, Max, Q
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.utils.safestring import mark_safe
from django.views.decorators.http import require_GET, require_POST

from audit.selectors import operation_q
from audit.views import history_context
from base.api.cached import row_inputs
from base.errors import DomainError
from base.rules import requires
from base.views import (
    RESIZE,
    RESTART,
    VIEW_OPERATION,
    poll_attributes,
    redirect_or_location,
    render_page,
    wants_partial,
)
from catalog.models import Node, Profile, Replica, ServedModel
from catalog.services import cards as card_services
from operations.models import RestartOperation, RestartStep
from operations.selectors import operations_with_steps
from operations.services import drain
from operations.services.start import operation_cancel as cancel_operation
from operations.services.start import restart_start
from versions.cache import drawn_from, remembered

PAGE_SIZE = 50


def latest_for(model: ServedModel) -> RestartOperation | None:
    """The model's most recent restart, with its steps (two queries)."""
    return operations_with_steps().filter(model=model).order_by("-id").first()


def operation_of(change: Any) -> RestartOperation | None:
    """The restart a resize or context change started: on the change, or named by id in its dict."""
    operation = getattr(change, "operation", None)
    if operation is None or isinstance(operation, RestartOperation):
        return operation
    return RestartOperation.objects.filter(pk=operation).first()


def rollback_to(operation: RestartOperation) -> int | None:
    """After a restart that failed: the revision the profile's live replicas still run, when the
    profile has moved past it (what a rollback would go back to); else None."""
    if operation.state not in (RestartOperation.State.FAILED, RestartOperation.State.PARTLY_FAILED):
        return None
    profile = Profile.objects.get(pk=operation.profile_id)
    older = Replica.objects.filter(
        profile=profile, state__in=Replica.LIVE_STATES, revision__lt=profile.revision
    ).aggregate(revision=Max("revision"))["revision"]
    return int(older) if older is not None else None


def kept_latest_for(request: HttpRequest, model: ServedModel) -> tuple[RestartOperation | None, int | None]:
    """``latest_for(model)`` with its steps, and what a rollback would go back to, kept under the
    catalog's and the operations' versions (versions/cache.py); not while it is active, since its
    "abandoned" line is read from the clock."""

    def read() -> tuple[RestartOperation | None, int | None]:
        operation = latest_for(model)
        return operation, rollback_to(operation) if operation is not None else None

    return remembered(
        "latest-restart",
        ["structure", "placement", "replicas", "operations"],
        [model.pk],
        read,
        request=request,
        keep=lambda answer: answer[0] is None or not answer[0].is_active,
    )


_UNSET: Any = object()


def progress_context(
    request: HttpRequest, operation: RestartOperation, *, rollback: int | None = _UNSET, **extra: Any
) -> dict[str, Any]:
    """The restart card's context; ``rollback``: ``rollback_to(operation)`` when already read."""
    steps = list(operation.steps.all())
    done = sum(s.state == RestartStep.State.SUCCEEDED for s in steps)
    failed = sum(s.state == RestartStep.State.FAILED for s in steps)
    return {
        "operation": operation,
        "steps": steps,
        "steps_done": done,
        "steps_failed": failed,
        "steps_finished": sum(s.is_finished for s in steps),
        "can_restart": request.user.has_perm(RESTART),
        "rollback_to": rollback_to(operation) if rollback is _UNSET else rollback,
        "can_rollback": request.user.has_perm(RESIZE) and not operation.model.declared,
        # Out-of-band updates only ride along a fragment, never a whole page.
        "fragment": wants_partial(request),
        **extra,
    }


def operation_rows(model: str, page_number: str | None) -> tuple[str, bool]:
    """The operations list's table and pager for a model (or all) and a page; and whether any
    operation on it is active (its "abandoned" line is read from the clock). Each ended operation's
    row is kept by what it is drawn from (``drawn_from``: its columns, its step counts, its model's and
    profile's names, the time zone): a model's edit reads the page again and draws none of it."""
    qs = (
        RestartOperation.objects.select_related("model", "profile")
        .only(*(f.name for f in RestartOperation._meta.concrete_fields), "model__name", "profile__name")
        .annotate(
            steps_total=Count("steps"),
            steps_done=Count("steps", filter=Q(steps__state=RestartStep.State.SUCCEEDED)),
            steps_failed=Count("steps", filter=Q(steps__state=RestartStep.State.FAILED)),
        )
        .order_by("-id")
    )
    if model:
        qs = qs.filter(model__name=model)
    page = Paginator(qs, PAGE_SIZE).get_page(page_number)
    zone = timezone.get_current_timezone_name()
    rows = [
        _operation_row(op)
        if op.is_active  # its "abandoned" line is the clock's: drawn at every request
        else drawn_from("operation-row", (zone, row_inputs(op)), partial(_operation_row, op))
        for op in page.object_list
    ]
    html = render_to_string(
        "operations/operation_list.html#rows",
        {"page": page, "model_name": model, "rows_html": mark_safe("".join(rows))},  # noqa: S308 - a template's
    )
    return html, any(op.is_active for op in page.object_list)


def _operation_row(op: RestartOperation) -> str:
    return render_to_string("operations/operation_list.html#row", {"op": op})


@requires(VIEW_OPERATION)
@require_GET
def operation_list(request: HttpRequest) -> HttpResponse:
    model = request.GET.get("model", "")
    page_number = request.GET.get("page")
    # Kept under the catalog's and the operations' versions (versions/cache.py), unless it shows an
    # active restart; nothing in it is the reader's.
    rows, active = remembered(
        "operation-rows",
        [
            "names",
            "operations",
        ],  # the models' and profiles' names (versions/triggers.py, ``NAMED``), the restarts
        [model, page_number],
        lambda: operation_rows(model, page_number),
        request=request,
        keep=lambda answer: not answer[1],
    )
    # While a restart on it is active the table polls itself (LLMGW_PAGE_POLL_SECONDS); the answer
    # that shows none active comes without the trigger, which stops it.
    poll = poll_attributes(request.get_full_path(), "active") if active else ""
    return render_page(
        request,
        "operations/operation_list.html",
        {"section": "operations", "model_name": model, "rows": mark_safe(rows), "poll": poll},  # noqa: S308 - a template's
        partial="polled",
    )


@requires(VIEW_OPERATION)
@require_GET
def operation_detail(request: HttpRequest, pk: int) -> HttpResponse:
    operation = get_object_or_404(operations_with_steps(), pk=pk)
    context = {
        "section": "operations",
        **progress_context(request, operation),
        **history_context(request, operation_q(operation.pk), operation=str(operation.pk)),
    }
    response = render_page(request, "operations/operation_detail.html", context, partial="progress")
    if wants_partial(request):
        # The model page's replicas section refreshes on this, so it changes with the card.
        response["HX-Trigger"] = "restart-progress"
    return response


@requires(RESTART)
@require_POST
def operation_cancel(request: HttpRequest, pk: int) -> HttpResponse:
    get_object_or_404(RestartOperation, pk=pk)
    error = ""
    try:
        cancel_operation(operation_id=pk)
    except DomainError as err:
        error = err.message
    if wants_partial(request):
        operation = operations_with_steps().get(pk=pk)
        return render_page(
            request,
            "operations/operation_detail.html",
            progress_context(request, operation, cancel_error=error),
            partial="progress",
        )
    if error:
        messages.error(request, error)
    else:
        # The page says what a cancel does ("the steps under way finish, ..."): the message only what
        # was done, so the sentence is not read twice.
        messages.success(request, f"Cancel of restart #{pk} asked.")
    return redirect_or_location(request, reverse("operation-detail", args=[pk]))


@requires(RESTART)
@require_POST
def model_restart(request: HttpRequest, name: str) -> HttpResponse:
    """Restart the model's stale replicas on their profile; the model's page then shows it live."""
    model = get_object_or_404(ServedModel, name=name)
    try:
        operation = restart_start(model_name=model.name)
    except DomainError as err:
        messages.error(request, err.message)
    else:
        messages.success(request, f"Restart #{operation.pk} of {model.name} started.")
    return redirect_or_location(request, reverse("model-detail", args=[model.name]) + "#restart")


# -- taking a node out of service, moving a replica (operations/services/drain.py) ----------------


def _node_change(request: HttpRequest, name: str, change: Any, done: Callable[[Any], str]) -> HttpResponse:
    get_object_or_404(Node, name=name)
    try:
        result = change(node_name=name)
    except DomainError as err:
        messages.error(request, err.message)
    else:
        messages.success(request, done(result))
    return redirect_or_location(request, reverse("node-detail", args=[name]))


def _drained(operations: list[RestartOperation]) -> str:
    started = ", ".join(f"#{op.pk} ({op.model.name})" for op in operations)
    return f"Cordoned, and moving its replicas to other nodes: restart{'s' if len(operations) > 1 else ''} {started}."


@requires(RESTART)
@require_POST
def node_cordon(request: HttpRequest, name: str) -> HttpResponse:
    return _node_change(request, name, drain.node_cordon, lambda n: f"{n.name} cordoned.")


@requires(RESTART)
@require_POST
def node_uncordon(request: HttpRequest, name: str) -> HttpResponse:
    return _node_change(request, name, drain.node_uncordon, lambda n: f"{n.name} takes placements again.")


@requires(RESTART)
@require_GET
def node_drain_preview(request: HttpRequest, name: str) -> HttpResponse:
    """Where a drain would move each replica on the node (nothing changed), and the button that
    drains it; or why it would be refused."""
    node = get_object_or_404(Node, name=name)
    try:
        moves, refusal = drain.node_drain_plan(node_name=name), ""
    except DomainError as err:
        moves, refusal = [], err.message
    return render_page(
        request,
        "operations/move_preview.html",
        {
            "section": "nodes",
            "title": f"Drain {node.name}?",
            "moves": moves,
            "refusal": refusal,
            "confirm_url": reverse("node-drain", args=[name]),
            "confirm_label": f"Drain {node.name}",
            "to_node": "",
            "back_url": reverse("node-detail", args=[name]),
            "back_label": f"Back to {node.name}",
            "what": f"{node.name} is cordoned first (no new replica is placed on it); each replica then "
            "starts again on the node shown and is ready there before its old one stops.",
        },
    )


@requires(RESTART)
@require_POST
def node_drain(request: HttpRequest, name: str) -> HttpResponse:
    return _node_change(request, name, drain.node_drain, _drained)


@requires(RESTART)
@require_GET
def replica_move_preview(request: HttpRequest, name: str) -> HttpResponse:
    """Where a move would take the replica (to the node chosen, or the best fit; nothing changed),
    and the button that moves it; or why it would be refused."""
    replica = get_object_or_404(Replica, name=name)
    to_node = request.GET.get("to") or None
    try:
        moves, refusal = [drain.replica_move_plan(replica_name=name, to_node=to_node)], ""
    except DomainError as err:
        moves, refusal = [], err.message
    return render_page(
        request,
        "operations/move_preview.html",
        {
            "section": "models",
            "title": f"Move {replica.name}?",
            "moves": moves,
            "refusal": refusal,
            "confirm_url": reverse("replica-move", args=[name]),
            "confirm_label": f"Move {replica.name}",
            "to_node": to_node or "",
            "back_url": reverse("replica-detail", args=[name]),
            "back_label": f"Back to {replica.name}",
            "what": "Its replacement starts on the node shown and is ready there before it stops.",
        },
    )


@requires(RESTART)
@require_POST
def card_cordon(request: HttpRequest, name: str) -> HttpResponse:
    """The node page's form: one card, by its index, and why."""
    raw = request.POST.get("index", "")
    if not raw.isdigit():
        messages.error(request, "Choose the card to cordon by its number on this node.")
        return redirect_or_location(request, reverse("node-detail", args=[name]))
    index = int(raw)
    return _node_change(
        request,
        name,
        lambda node_name: card_services.card_cordon(
            node_name=node_name, index=index, reason=request.POST.get("reason", "")
        ),
        lambda c: f"Card {c.index} of {c.node.name} cordoned.",
    )


@requires(RESTART)
@require_POST
def card_uncordon(request: HttpRequest, name: str, index: int) -> HttpResponse:
    return _node_change(
        request,
        name,
        lambda node_name: card_services.card_uncordon(node_name=node_name, index=index),
        lambda c: f"Card {c.index} of {c.node.name} takes placements again.",
    )


@requires(RESTART)
@require_POST
def replica_move(request: HttpRequest, name: str) -> HttpResponse:
    replica = get_object_or_404(Replica.objects.select_related("profile__model"), name=name)
    to_node = request.POST.get("to") or None
    try:
        operation = drain.replica_move(replica_name=name, to_node=to_node)
    except DomainError as err:
        messages.error(request, err.message)
        return redirect_or_location(request, reverse("replica-detail", args=[name]))
    messages.success(request, f"Moving {name} to {to_node or 'another node'}: restart #{operation.pk}.")
    return redirect_or_location(
        request, reverse("model-detail", args=[replica.profile.model.name]) + "#restart"
    )
