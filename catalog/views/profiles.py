"""A profile's revisions page: each revision from the audit log, a diff between any two, and rollback.

Rollback posts to the same service the API and the command call
(``catalog.services.rollback.profile_rollback``); a refusal is shown as the
API's sentence, and nothing changes.
"""

from __future__ import annotations

from django.contrib import messages
from django.db.models import Q
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from access.rules import requires
from audit.summary import diff_rows, summarize
from audit.views import history_context
from catalog.errors import DomainError
from catalog.models import Profile, Replica
from catalog.services.rollback import profile_rollback, revisions
from catalog.views.common import RESIZE, redirect_or_location, render_page


def _number(value: str | None) -> int | None:
    try:
        return int(value) if value else None
    except ValueError:
        return None


@requires("catalog.view_profile")
@require_GET
def profile_revisions(request: HttpRequest, name: str, profile: str) -> HttpResponse:
    found = get_object_or_404(
        Profile.objects.select_related("model", "gpu_class"), model__name=name, name=profile
    )
    found_revisions = revisions(found)
    by_number = {r.number: r for r in found_revisions}
    a, b = _number(request.GET.get("a")), _number(request.GET.get("b"))
    if a not in by_number or b not in by_number:
        numbers = [r.number for r in found_revisions]
        a, b = (numbers[1], numbers[0]) if len(numbers) > 1 else (None, None)
    diff = diff_rows(by_number[a].settings, by_number[b].settings) if a is not None and b is not None else []
    running = sorted(
        set(
            Replica.objects.filter(profile=found, state__in=Replica.LIVE_STATES).values_list(
                "revision", flat=True
            )
        )
    )
    return render_page(
        request,
        "catalog/profile_revisions.html",
        {
            "section": "models",
            "profile": found,
            "model": found.model,
            "revisions": [(r, summarize(r.entry)) for r in found_revisions],
            "a": a,
            "b": b,
            "diff": diff,
            "running": running,
            "can_rollback": request.user.has_perm(RESIZE) and not found.model.declared,
            **history_context(
                request,
                Q(object_type="profile", object_key=str(found)),
                object_type="profile",
                object=str(found),
            ),
        },
    )


@requires(RESIZE)
@require_POST
def profile_rollback_apply(request: HttpRequest, name: str, profile: str) -> HttpResponse:
    found = get_object_or_404(Profile, model__name=name, name=profile)
    revision = _number(request.POST.get("revision"))
    back = reverse("profile-revisions", args=[name, profile])
    if revision is None:
        messages.error(request, "Say which revision to roll back to (a number), and nothing was changed.")
        return redirect_or_location(request, back)
    try:
        done = profile_rollback(model=name, profile=found.name, revision=revision)
    except DomainError as err:
        messages.error(request, err.message)
        return redirect_or_location(request, back)
    if done.operation is not None:
        messages.success(
            request,
            f"{done.profile} is at revision {done.new_revision}, with revision {revision}'s settings; "
            f"restart #{done.operation} brings its replicas onto it.",
        )
        return redirect_or_location(request, reverse("operation-detail", args=[done.operation]))
    messages.success(
        request, f"{done.profile} is at revision {done.new_revision}, with revision {revision}'s settings."
    )
    return redirect_or_location(request, back)
