"""The engines' releases page: each engine's fleet default, what the package index last said of its
newest release (the release watch), the floors its releases need; an upgrade's dry run (the fleet's
default of an engine, or one profile's release), then the button that applies it, posting to the same
service the API and ``manage.py engine_upgrade`` call (``operations.services.upgrade``)."""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from base.errors import DomainError
from base.rules import requires
from base.views import RESTART, redirect_or_location, render_page
from catalog.selectors import engine_defaults
from operations.services.release_watch import latest_check
from operations.services.upgrade import upgrade_apply, upgrade_what_if
from planning import registry


def _engines() -> list[dict[str, object]]:
    check = latest_check()
    watched = {e["engine"]: e for e in (check.results if check is not None else [])}
    defaults = engine_defaults()
    return [
        {
            "name": name,
            "default": defaults.get(name, ""),
            "watch": watched.get(name),
            "floors": eng.floors,
            "package": eng.package,
        }
        for name, eng in sorted(registry().items())
    ]


@requires("catalog.view_profile")
@require_GET
def release_list(request: HttpRequest) -> HttpResponse:
    """The page; with ``?engine=&release=[&profile=]``, the upgrade's dry run under it."""
    plan, refusal = None, ""
    asked = {k: request.GET.get(k, "").strip() for k in ("engine", "release", "profile")}
    if asked["engine"] and asked["release"]:
        try:
            plan = upgrade_what_if(
                engine_name=asked["engine"], release=asked["release"], profile=asked["profile"] or None
            )
        except DomainError as err:
            refusal = err.message
    elif asked["engine"] or asked["release"]:
        refusal = "Say both the engine and the release to move to."
    return render_page(
        request,
        "catalog/release_list.html",
        {
            "section": "releases",
            "engines": _engines(),
            "check": latest_check(),
            "asked": asked,
            "plan": plan,
            "refusal": refusal,
            "can_upgrade": request.user.has_perm(RESTART),
        },
    )


@requires(RESTART)
@require_POST
def release_upgrade(request: HttpRequest) -> HttpResponse:
    engine, release, profile = (request.POST.get(k, "").strip() for k in ("engine", "release", "profile"))
    back = reverse("release-list")
    try:
        done = upgrade_apply(engine_name=engine, release=release, profile=profile or None)
    except DomainError as err:
        messages.error(request, f"{err.message} Nothing was changed.")
        return redirect_or_location(request, back)
    what = f"{profile}'s release" if profile else f"The fleet's default release of {engine}"
    said = f"{what} is {release} now"
    if done.operations:
        messages.success(
            request,
            f"{said}; restarts {', '.join(f'#{n}' for n in done.operations)} bring its replicas onto it.",
        )
    else:
        messages.success(request, f"{said}; no replica ran the old one.")
    return redirect_or_location(request, back)
