"""How every page, view and API endpoint says what it needs: ``required_permission``.

One attribute, read by one gate for pages (:func:`requires`, :class:`RequiredPermissionMixin`) and
one for the API (:class:`RequiredPermission`, DRF's default permission class). Its value is

- :data:`PUBLIC`: anyone, signed in or not (the sign-in page);
- :data:`SIGNED_IN`: any signed-in user (their own tokens, who am I);
- ``"app_label.codename"``: a permission, for every method;
- a mapping from HTTP method to one of those (:func:`model_permissions` builds the CRUD one).

A view that declares nothing is refused, and ``manage.py check`` names it (access/checks.py), so a
new URL cannot be open by omission. The admin keeps Django's own per-model checks; the site itself
needs ``access.open_admin`` (llmgw_web/admin.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import wraps
from typing import TYPE_CHECKING, Any, TypeVar

from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.db import models
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from rest_framework.permissions import BasePermission

if TYPE_CHECKING:  # DRF's settings import this module while rest_framework.views loads
    from rest_framework.request import Request
    from rest_framework.views import APIView

PUBLIC = "public"
SIGNED_IN = "signed_in"

Rule = str | Mapping[str, str]
View = TypeVar("View", bound=Callable[..., HttpResponseBase])

# Methods that read: OPTIONS and HEAD need what GET needs.
_AS_GET = {"HEAD": "GET", "OPTIONS": "GET"}


def model_permissions(model: type[models.Model]) -> dict[str, str]:
    """The CRUD rule of ``model``: reads need its view permission, writes its add, change, delete."""
    meta = model._meta
    perm = f"{meta.app_label}.%s_{meta.model_name}"
    return {
        "GET": perm % "view",
        "POST": perm % "add",
        "PUT": perm % "change",
        "PATCH": perm % "change",
        "DELETE": perm % "delete",
    }


def rule_for(rule: Rule | None, method: str) -> str | None:
    """What ``rule`` asks of a ``method`` request; None when it says nothing (refused)."""
    if rule is None or isinstance(rule, str):
        return rule
    method = method.upper()
    return rule.get(method) or rule.get(_AS_GET.get(method, ""))


def read_permissions_once(request: Any) -> None:
    """The signed-in user's permissions, read once per version of the users', groups' and
    permissions' tables (the ``access`` area) rather than at every request: Django's ModelBackend
    reads them with two queries per request (the user's own, then its groups'), and every
    ``has_perm`` after, the page's and the templates', uses the set put here. A superuser's need
    no query; an inactive or anonymous user has none."""
    from django.contrib.auth.backends import ModelBackend

    from versions.cache import remembered

    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated or not user.is_active or user.is_superuser:
        return
    if hasattr(user, "_perm_cache"):
        return  # read already in this request

    def read() -> frozenset[str]:
        return frozenset(ModelBackend().get_all_permissions(user))

    # A read shares the versions it reads here with the view's kept parts (one query for both); a
    # write does not: the view may write before it asks for a kept part, which must then be
    # looked up under the versions after the write, not before it.
    reads = (getattr(request, "method", None) or "GET") in ("GET", "HEAD")
    kept = remembered("permissions", ["access"], [user.pk], read, request=request if reads else None)
    user._perm_cache = set(kept)


def allows(user: Any, need: str | None) -> bool:
    """Whether ``user`` may do what ``need`` names."""
    if need == PUBLIC:
        return True
    if need is None or not (user and user.is_authenticated):
        return False
    return need == SIGNED_IN or bool(user.has_perm(need))


def refusal(need: str | None, *, page: bool = False) -> str:
    """The sentence a refused, signed-in user reads: what is needed and which roles give it. The API's
    names the permission's code as well (what an admin grants); a page's keeps to words."""
    from django.contrib.auth.models import Permission

    from base.roles import ROLES, matches

    if need is None:
        return "This address declares no permission, so it is refused to everyone until it does."
    app_label, _, codename = need.partition(".")
    name = (
        Permission.objects.filter(content_type__app_label=app_label, codename=codename)
        .values_list("name", flat=True)
        .first()
    )
    roles = [r.name for r in ROLES if r.name != "admin" and matches(r, need)]
    given = f"the {' or '.join(roles)} role gives it" if roles else "only an admin has it"
    if page and name:
        return f"You need the permission “{name}”: {given}. Ask an admin to give you that role."
    return f"You need the permission '{name or need}' ({need}): {given}."


def declared_rule(callback: Any) -> Rule | None:
    """The rule a URL's view declares, whatever kind of view it is (function, Django or DRF class)."""
    for holder in (callback, getattr(callback, "view_class", None), getattr(callback, "cls", None)):
        rule = getattr(holder, "required_permission", None)
        if rule is not None:
            return rule
    return None


def _page_gate(request: HttpRequest, rule: Rule | None) -> HttpResponse | None:
    """None when the request may go on; the sign-in redirect for anonymous; 403 otherwise."""
    need = rule_for(rule, request.method or "GET")
    if need not in (PUBLIC, SIGNED_IN, None):
        read_permissions_once(request)
    if allows(request.user, need):
        return None
    if not request.user.is_authenticated:
        return redirect_to_login(request.get_full_path())
    raise PermissionDenied(refusal(need, page=True))


def requires(rule: Rule) -> Callable[[View], View]:
    """Declare and check a page's rule: anonymous → the sign-in page, refused → 403."""

    def decorate(view: View) -> View:
        @wraps(view)
        def gate(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
            return _page_gate(request, rule) or view(request, *args, **kwargs)

        gate.required_permission = rule  # type: ignore[attr-defined]
        return gate  # type: ignore[return-value]

    return decorate


class RequiredPermissionMixin:
    """The same gate for a Django class-based page: set ``required_permission`` on the class."""

    required_permission: Rule | None = None

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        return _page_gate(request, self.required_permission) or super().dispatch(request, *args, **kwargs)  # type: ignore[misc]


class RequiredPermission(BasePermission):
    """DRF's default permission class: the view's ``required_permission`` for the request's method.

    Anonymous callers get 401 (the token scheme is offered), signed-in ones without it 403.
    """

    def has_permission(self, request: Request, view: APIView) -> bool:
        need = rule_for(getattr(view, "required_permission", None), request.method or "GET")
        if need not in (PUBLIC, SIGNED_IN, None):
            read_permissions_once(request)
        if allows(request.user, need):
            return True
        if request.user and request.user.is_authenticated:
            self.message = refusal(need)
        return False
