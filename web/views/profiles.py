"""A profile's revisions page: each revision from the audit log, a diff between any two, and rollback.

Rollback shows its dry run first (which replicas adopt the new revision
without a restart, which are restarted and where), then posts to the same
service the API and the command call
(``operations.services.rollback.profile_rollback``); a refusal is shown as the
API's sentence, and nothing changes.
"""

from __future__ import annotations

from django.contrib import messages
from django.db.models import Q
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods

from audit.summary import diff_rows, summarize
from audit.views import history_context
from base.errors import DomainError
from base.rules import requires
from base.views import RESIZE, redirect_or_location, render_page
from catalog.models import Profile, Replica
from operations.services.rollback import profile_rollback, revisions


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
            "left": f"Revision {a}",
            "right": f"Revision {b}",
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
@require_http_methods(["GET", "POST"])
def profile_rollback_apply(request: HttpRequest, name: str, profile: str) -> HttpResponse:
    """GET: what rolling back to ``?revision=N`` would do (its dry run: which replicas adopt the new
    revision, which are restarted and where, or the refusal), with the button; POST: do it."""
    found = get_object_or_404(Profile.objects.select_related("model"), model__name=name, name=profile)
    if request.method == "GET":
        return _rollback_preview(request, found, _number(request.GET.get("revision")))
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
    said = f"{done.profile} is at revision {done.new_revision}, with revision {revision}'s settings"
    if done.adopted:
        names = ", ".join(a.replica for a in done.adopted)
        said += (
            f"; {names} run{'s' if len(done.adopted) == 1 else ''} them already and took it without a restart"
        )
    if done.operation is not None:
        messages.success(request, f"{said}; restart #{done.operation} brings the others onto it.")
        return redirect_or_location(request, reverse("operation-detail", args=[done.operation]))
    messages.success(request, f"{said}.")
    return redirect_or_location(request, back)


def _rollback_preview(request: HttpRequest, found: Profile, revision: int | None) -> HttpResponse:
    plan, refusal, diff = None, "", []
    if revision is None:
        refusal = "Say which revision to roll back to (?revision=N, a number)."
    else:
        try:
            plan = profile_rollback(
                model=found.model.name, profile=found.name, revision=revision, dry_run=True
            )
        except DomainError as err:
            refusal = err.message
        by_number = {r.number: r for r in revisions(found)}
        if revision in by_number and found.revision in by_number:
            diff = diff_rows(by_number[found.revision].settings, by_number[revision].settings)
    return render_page(
        request,
        "catalog/profile_rollback.html",
        {
            "section": "models",
            "profile": found,
            "model": found.model,
            "revision": revision,
            "plan": plan,
            "refusal": refusal,
            "diff": diff,
            "left": f"Revision {found.revision} (now)",
            "right": f"Revision {revision}",
        },
    )
