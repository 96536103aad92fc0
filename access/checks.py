"""``manage.py check`` (so ``make lint``, which runs makemigrations) names every view that does not
declare its ``required_permission``: such a view is refused to everyone, and a URL without a rule
fails the role × URL matrix test too."""

from __future__ import annotations

from typing import Any

from django.core.checks import Error, register

from access.urlmap import routes
from base.rules import declared_rule


@register("urls")
def check_views_declare_permission(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    return [
        Error(
            f"The view of URL {route.pattern!r} ({route.name}) declares no required_permission.",
            hint="Declare it with @requires(...) or a required_permission attribute (docs/design.md, Access).",
            obj=route.callback,
            id="access.E001",
        )
        for route in routes()
        if not route.in_admin and declared_rule(route.callback) is None
    ]
