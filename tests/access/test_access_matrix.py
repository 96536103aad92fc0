"""Every role against every URL: each page, admin view and API endpoint, anonymous included.

The cases are generated from the URL configuration (access/urlmap.py), so a URL this file has no
rule for fails here: add its row to PAGES_AND_API (or its model to ADMIN_MODELS), naming which roles
may use it — the expected answer is written here, not read from the views. Allowed means past the
permission gate (whatever the view then answers, below 500); refused means the sign-in redirect or
401 for anonymous callers, 403 (or the admin's sign-in page) for a signed-in user.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.contrib.contenttypes.models import ContentType
from django.db import transaction
from django.test import Client

from access.models import Token
from access.urlmap import Route, routes
from audit.models import AuditEntry
from audit.services import audit_record
from base.rules import declared_rule
from operations.models import RestartOperation
from tests.support import builders as b

pytestmark = pytest.mark.django_db

ROLES = ("viewer", "operator", "editor", "lead", "admin")
EVERYONE = frozenset({"anonymous", "norole", *ROLES})
SIGNED_IN = frozenset({"norole", *ROLES})
READ = frozenset(ROLES)  # every role reads the pages and the API; a user with no role reads nothing
OPERATE = frozenset({"operator", "admin"})
EDIT = frozenset({"editor", "admin"})
ADMIN_SITE = frozenset({"editor", "lead", "admin"})  # access.open_admin
AUDIT = frozenset({"lead", "admin"})
ONLY_ADMIN = frozenset({"admin"})
NOBODY: frozenset[str] = frozenset()

CRUD_LIST = {"GET": READ, "POST": EDIT}
CRUD_DETAIL = {"GET": READ, "PUT": EDIT, "PATCH": EDIT, "DELETE": EDIT}

# Pages and API, by URL name: method → the roles that may.
PAGES_AND_API: dict[str, dict[str, frozenset[str]]] = {
    "login": {"GET": EVERYONE},
    "logout": {"POST": EVERYONE},
    "model-list": {"GET": READ},
    "model-detail": {"GET": READ},
    "model-replicas": {"GET": READ},
    "model-resize-preview": {"POST": OPERATE},
    "model-resize": {"POST": OPERATE},
    "model-context-preview": {"POST": OPERATE},
    "model-context": {"POST": OPERATE},
    "model-restart": {"POST": OPERATE},
    "replica-detail": {"GET": READ},
    "replica-log": {"GET": READ},
    "replica-log-download": {"GET": READ},
    "replica-move": {"POST": OPERATE},
    "replica-move-preview": {"GET": OPERATE},
    "node-cordon": {"POST": OPERATE},
    "node-uncordon": {"POST": OPERATE},
    "node-drain": {"POST": OPERATE},
    "node-drain-preview": {"GET": OPERATE},
    "card-cordon": {"POST": OPERATE},
    "card-uncordon": {"POST": OPERATE},
    "profile-revisions": {"GET": READ},
    "profile-rollback": {"GET": OPERATE, "POST": OPERATE},
    "api-node-cordon": {"POST": OPERATE},
    "api-node-uncordon": {"POST": OPERATE},
    "api-node-drain": {"POST": OPERATE},
    "api-card-cordon": {"POST": OPERATE},
    "api-card-uncordon": {"POST": OPERATE},
    "api-replica-move": {"POST": OPERATE},
    "api-model-rollback": {"POST": OPERATE},
    "api-profile-revisions": {"GET": READ},
    "audit:outside_list": {"GET": AUDIT},
    # Prometheus is no user: the view checks its own bearer token (off, 404, unless one is set).
    "metrics": {"GET": EVERYONE},
    "node-list": {"GET": READ},
    "node-detail": {"GET": READ},
    "operation-list": {"GET": READ},
    "operation-detail": {"GET": READ},
    "operation-cancel": {"POST": OPERATE},
    "schema": {"GET": SIGNED_IN},
    "api-docs": {"GET": SIGNED_IN},
    # A user's own tokens: another's token is not found for them (tests/access/test_tokens.py).
    "token-list": {"GET": SIGNED_IN, "POST": SIGNED_IN},
    "token-revoke": {"POST": SIGNED_IN},
    # A user's own password (tests/access/test_password.py).
    "password-change": {"GET": SIGNED_IN, "POST": SIGNED_IN},
    "audit:entry_list": {"GET": AUDIT},
    "audit:entry_detail": {"GET": AUDIT},
    "audit:entry_export": {"GET": AUDIT},
    "api-audit-list": {"GET": AUDIT},
    "api-audit-export": {"GET": AUDIT},
    "api-root": {"GET": SIGNED_IN},
    "api-whoami": {"GET": SIGNED_IN},
    "api-model-gpus": {"POST": OPERATE},
    "api-model-context": {"POST": OPERATE},
    "api-model-restart": {"POST": OPERATE},
    "api-operation-list": {"GET": READ},
    "api-operation-detail": {"GET": READ},
    "api-operation-cancel": {"POST": OPERATE},
    "api-releases": {"GET": READ},
    "release-list": {"GET": READ},
    "profile-pin-kv": {"POST": EDIT},
    "release-upgrade": {"POST": OPERATE},
    "api-releases-upgrade": {"POST": OPERATE},
    "api-profile-pin-kv": {"POST": EDIT},
    **{f"api-{m}-list": CRUD_LIST for m in ("gpuclass", "node", "model", "profile", "replica")},
    **{f"api-{m}-detail": CRUD_DETAIL for m in ("gpuclass", "node", "model", "profile", "replica")},
}


@dataclass(frozen=True)
class AdminRule:
    view: frozenset[str]  # changelist, change form (read), history
    add: frozenset[str]
    delete: frozenset[str]


CATALOG = AdminRule(view=ADMIN_SITE, add=EDIT, delete=EDIT)
SHOWN = AdminRule(view=ADMIN_SITE, add=NOBODY, delete=NOBODY)  # read-only in the admin
ADMIN_MODELS = {
    "auth.group": AdminRule(ONLY_ADMIN, ONLY_ADMIN, ONLY_ADMIN),
    "auth.user": AdminRule(ONLY_ADMIN, ONLY_ADMIN, ONLY_ADMIN),
    "django_tasks_database.dbtaskresult": AdminRule(ONLY_ADMIN, NOBODY, NOBODY),
    "audit.auditentry": AdminRule(AUDIT, NOBODY, NOBODY),
    "catalog.gpuclass": CATALOG,
    "catalog.node": CATALOG,
    "catalog.servedmodel": CATALOG,
    "catalog.profile": CATALOG,
    "catalog.card": CATALOG,
    "catalog.replica": CATALOG,
    "operations.restartoperation": SHOWN,
    "access.token": AdminRule(ONLY_ADMIN, NOBODY, ONLY_ADMIN),  # listed and revoked, never made there
    # django-axes' records of sign-ins: read, and deleted to unlock, by admins.
    "axes.accessattempt": AdminRule(ONLY_ADMIN, NOBODY, ONLY_ADMIN),
    "axes.accesslog": AdminRule(ONLY_ADMIN, NOBODY, ONLY_ADMIN),
    "axes.accessfailurelog": AdminRule(ONLY_ADMIN, NOBODY, ONLY_ADMIN),
}
# An app's index in the admin opens for whoever may open one of its models there.
ADMIN_APPS = {
    "auth": ONLY_ADMIN,
    "django_tasks_database": ONLY_ADMIN,
    "audit": AUDIT,
    "catalog": ADMIN_SITE,
    "operations": ADMIN_SITE,
    "access": ONLY_ADMIN,
    "axes": ONLY_ADMIN,
}
ADMIN_SITE_URLS = {
    "admin:index": ADMIN_SITE,
    "admin:login": EVERYONE,
    "admin:logout": ADMIN_SITE,
    "admin:password_change": ADMIN_SITE,
    "admin:password_change_done": ADMIN_SITE,
    "admin:jsi18n": ADMIN_SITE,
    "admin:autocomplete": ADMIN_SITE,  # then 403 for want of a field to complete: see _allowed
    "admin:view_on_site": ADMIN_SITE,
    "admin:auth_user_password_change": ONLY_ADMIN,
    "admin:catalog_model_import": EDIT,
    "admin/(?P<url>.*)$": ADMIN_SITE,  # the catch-all: 404 for those who may open the admin
}


@dataclass(frozen=True)
class Case:
    route: Route
    method: str
    url_values: tuple[tuple[str, str], ...] = ()  # a choice within the pattern (the admin's app)

    @property
    def id(self) -> str:
        extra = "".join(f"[{v}]" for _, v in self.url_values)
        return f"{self.method} {self.route.name}{extra}"


def _admin_rule(route: Route) -> tuple[str, dict[str, frozenset[str]]] | None:
    admin = getattr(route.callback, "model_admin", None)
    if admin is None:
        return None
    meta = admin.model._meta
    rule = ADMIN_MODELS.get(f"{meta.app_label}.{meta.model_name}")
    if rule is None:
        return None
    name = route.name.rsplit("_", 1)[-1]
    if route.name.endswith("/"):  # the old object URL: a redirect to its change form, for the site's users
        return route.name, {"GET": ADMIN_SITE}
    kind = {"changelist": "view", "change": "view", "history": "view", "add": "add", "delete": "delete"}
    return route.name, {"GET": getattr(rule, kind[name])}


def rules_of(route: Route) -> dict[str, frozenset[str]] | None:
    if not route.in_admin:
        return PAGES_AND_API.get(route.name)
    if route.name in ADMIN_SITE_URLS:
        return {"GET": ADMIN_SITE_URLS[route.name]}
    if route.name == "admin:app_list":
        return {"GET": READ}  # per app, below
    found = _admin_rule(route)
    return found[1] if found else None


def cases() -> list[Case]:
    out = []
    for route in routes():
        rules = rules_of(route)
        if rules is None:
            out.append(Case(route, "GET"))  # fails: no rule
        elif route.name == "admin:app_list":
            out += [Case(route, "GET", (("app_label", app),)) for app in ADMIN_APPS]
        else:
            out += [Case(route, method) for method in rules]
    return out


CASES = cases()


def expected(case: Case) -> frozenset[str]:
    if case.route.name == "admin:app_list":
        return ADMIN_APPS[dict(case.url_values)["app_label"]]
    rules = rules_of(case.route)
    assert rules is not None, (
        f"URL {case.route.pattern!r} ({case.route.name}) has no rule in tests/access/test_access_matrix.py: "
        "add which roles may use it (docs/design.md, Access)."
    )
    return rules[case.method]


# -- the world the requests find ----------------------------------------------------------------------


@pytest.fixture
def world(actor: Any) -> dict[str, Any]:
    node = b.node("gpu-1")
    card = node.cards.select_related("gpu_class").get(index=0)
    model = b.llama_8b("llama")
    profile = b.profile(model, "h100")
    replica = b.replica(profile, node, [0], name="llama-1")
    operation = RestartOperation.objects.create(model=model, profile=profile, via="cli")
    with transaction.atomic():
        entry = audit_record(action="create", object_type="node", object_key="gpu-1")
    users = {}
    for role in ("norole", *ROLES):
        user = get_user_model().objects.create_user(username=role, password=None)
        user.groups.set(Group.objects.filter(name=role))
        users[role] = user
    from django_tasks_db.models import DBTaskResult

    from operations.tasks import run_restart

    run_restart.enqueue(operation.pk)
    objects = {
        "auth.group": Group.objects.get(name="viewer"),
        "auth.user": users["viewer"],
        "audit.auditentry": entry,
        "catalog.gpuclass": card.gpu_class,
        "catalog.node": node,
        "catalog.servedmodel": model,
        "catalog.profile": profile,
        "catalog.card": card,
        "catalog.replica": replica,
        "operations.restartoperation": operation,
        "django_tasks_database.dbtaskresult": DBTaskResult.objects.first(),
        **_axes_rows(),
        "access.token": Token.objects.get(token_key=b.token(users["viewer"])[:15]),
    }
    assert AuditEntry.objects.exists()
    return {
        "users": users,
        "objects": objects,
        "values": {
            "gpu-classes": card.gpu_class.name,
            "nodes": node.name,
            "cards": str(card.index),
            "models": model.name,
            "replicas": replica.name,
            "profiles": str(profile.pk),
            "operations": str(operation.pk),
            "audit": str(entry.pk),
            "tokens": "llmgw_nokey",
        },
    }


def _axes_rows() -> dict[str, Any]:
    from axes.models import AccessAttempt, AccessFailureLog, AccessLog

    seen = {
        "username": "alice",
        "ip_address": "10.0.0.1",
        "user_agent": "t",
        "path_info": "/",
        "http_accept": "*",
    }
    return {
        "axes.accessattempt": AccessAttempt.objects.create(
            **seen, get_data="", post_data="", failures_since_start=1
        ),
        "axes.accesslog": AccessLog.objects.create(**seen),
        "axes.accessfailurelog": AccessFailureLog.objects.create(**seen, locked_out=False),
    }


_PARAM = re.compile(r"<(?:(\w+):)?(\w+)>|\(\?P<(\w+)>[^)]*\)")


def url_of(case: Case, world: dict[str, Any]) -> str:
    """The route's pattern with a value for each of its parameters, from the world."""
    pattern = case.route.pattern
    chosen = dict(case.url_values)
    admin = getattr(case.route.callback, "model_admin", None)

    def value(match: re.Match[str]) -> str:
        converter, name = match.group(1), match.group(2) or match.group(3)
        if name in chosen:
            return chosen[name]
        if name == "format":
            return ".json" if converter == "drf_format_suffix" else "json"
        if name == "url":
            return "nowhere/"
        if name == "kind":
            return "csv"
        if name == "profile":
            return world["objects"]["catalog.profile"].name
        if name == "object_id" and admin is not None:
            meta = admin.model._meta
            obj = world["objects"][f"{meta.app_label}.{meta.model_name}"]
            return str(obj.pk if obj is not None else 1)
        if name == "id":
            return str(world["users"]["viewer"].pk)
        if name == "content_type_id":
            return str(ContentType.objects.get_for_model(world["objects"]["catalog.node"]).pk)
        if name == "object_id":
            return str(world["objects"]["catalog.node"].pk)
        before = pattern[: match.start()].rstrip("/").replace("^", "")
        collection = re.split(r"[/^]", before)[-1]
        return world["values"][collection]

    url = _PARAM.sub(value, pattern)
    url = url.replace("\\.", ".").replace("/?$", "").replace("$", "").replace("^", "")
    return "/" + url


def _refused(case: Case, response: Any, role: str) -> bool:
    location = response.get("Location", "")
    # The sign-in page, told where to come back to (a sign-out's own redirect there says no "next").
    to_sign_in = response.status_code == 302 and bool(re.match(r"/(accounts|admin)/login/\?next=", location))
    if case.route.name == "admin:logout":
        # The admin's sign-out sends whoever may not open the admin to its index, which refuses them.
        to_sign_in = to_sign_in or (response.status_code == 302 and location == "/admin/")
    if role == "anonymous":
        return response.status_code == 401 or to_sign_in
    return response.status_code == 403 or to_sign_in


def _allowed(case: Case, response: Any) -> bool:
    if case.route.name == "admin:autocomplete":  # past the site's gate; then no field to complete
        return response.status_code == 403 and "Location" not in response
    if case.route.name == "replica-log-download" and response.status_code == 504:
        return True  # past the permission: the world's node has no agent running, a gateway's answer
    return response.status_code < 500 and not _refused(case, response, "someone")


def _request(client: Client, method: str, url: str) -> Any:
    if method == "GET":
        return client.get(url)
    if method == "POST" and not url.startswith("/api/"):
        return client.post(url, {})
    return client.generic(method, url, "{}", content_type="application/json")


def test_the_matrix_covers_every_url_of_the_configuration():
    """Each URL has a rule here, and each view outside the admin declares its own."""
    missing = [r.name for r in routes() if rules_of(r) is None]
    undeclared = [r.name for r in routes() if not r.in_admin and declared_rule(r.callback) is None]
    assert (missing, undeclared) == ([], [])


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_each_role_is_allowed_or_refused_as_its_rule_says(case: Case, world: dict[str, Any]):
    allowed = expected(case)
    url = url_of(case, world)
    # The refused first: an allowed write (a delete) must not change what a later one finds.
    order = sorted(EVERYONE, key=lambda role: (role in allowed, role))
    wrong = []
    for role in order:
        client = Client()
        if role != "anonymous":
            client.force_login(world["users"][role])
        response = _request(client, case.method, url)
        ok = _allowed(case, response) if role in allowed else _refused(case, response, role)
        if not ok:
            wrong.append(f"{role}: {response.status_code} {response.get('Location', '')}".strip())
    assert wrong == [], f"{case.method} {url}: expected allowed for {sorted(allowed)}"


def test_a_setting_opens_the_schema_and_the_docs_to_anyone(settings):
    assert Client().get("/api/schema/").status_code == 401
    assert Client().get("/api/docs/")["Location"].startswith("/accounts/login/?next=")
    settings.LLMGW_API_DOCS_PUBLIC = True
    assert Client().get("/api/schema/").status_code == 200
    assert Client().get("/api/docs/").status_code == 200


def test_a_refusal_names_the_permission_and_the_roles_that_give_it():
    client = Client()
    client.force_login(b.user("someone"))  # a viewer
    response = client.post("/api/models/llama/gpus/", {"gpus": 2}, content_type="application/json")
    assert response.status_code == 403
    assert response.json() == {
        "detail": "You need the permission 'Can resize a model or change its context' "
        "(catalog.resize_model): the operator role gives it.",
        "code": "permission_denied",
    }
