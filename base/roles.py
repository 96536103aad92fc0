"""The roles: groups with their permissions, made by a migration and kept whole after each migrate.

A role lists permissions as ``app_label.codename`` patterns (``catalog.view_*``). The data migration
(0002_roles) creates the groups; after every ``migrate`` the permissions a role names but its group
lacks are added (never removed: what an admin granted by hand stays). So a new permission reaches its
roles by being named here — docs/design.md, "Access".
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

READS = ("catalog.view_*", "operations.view_*")


@dataclass(frozen=True)
class Role:
    name: str
    does: str
    perms: tuple[str, ...]


ROLES = (
    Role("viewer", "reads every page and the API", READS),
    Role(
        "operator",
        "resizes, changes context, restarts and cancels restarts",
        (*READS, "catalog.resize_model", "catalog.restart_model"),
    ),
    Role(
        "editor",
        "writes the catalog in the admin and the API",
        (*READS, "catalog.add_*", "catalog.change_*", "catalog.delete_*", "access.open_admin"),
    ),
    Role(
        "lead",
        "reads and exports the audit log",
        (*READS, "audit.view_auditentry", "audit.export_auditentry", "access.open_admin"),
    ),
    Role("admin", "everything, users and roles included", ("*",)),
)
ROLE_NAMES = tuple(r.name for r in ROLES)


def role(name: str) -> Role:
    return next(r for r in ROLES if r.name == name)


def matches(role_: Role, perm: str) -> bool:
    """Whether ``role_`` names ``perm`` (``app_label.codename``)."""
    return any(fnmatchcase(perm, pattern) for pattern in role_.perms)


def sync_roles(apps: Any) -> None:
    """Create the role groups and add each the permissions it names (``apps``: a registry, the
    migration's or the project's)."""
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    perms = list(Permission.objects.select_related("content_type"))
    for r in ROLES:
        group, _ = Group.objects.get_or_create(name=r.name)
        wanted = [p for p in perms if matches(r, f"{p.content_type.app_label}.{p.codename}")]
        group.permissions.add(*wanted)


def sync_roles_in_migration(apps: Any, schema_editor: Any) -> None:
    """The data migration's step: permissions are made after ``migrate`` by default; make them now."""
    from django.contrib.auth.management import create_permissions

    for app_config in apps.get_app_configs():
        app_config.models_module = True
        create_permissions(app_config, apps=apps, verbosity=0)
        app_config.models_module = None
    sync_roles(apps)


def sync_roles_after_migrate(sender: Any, **kwargs: Any) -> None:
    """post_migrate (after ``migrate`` and after a test database is flushed): once, at the last app,
    when every app's permissions exist."""
    from django.apps import apps as project_apps

    if sender.label != list(project_apps.get_app_configs())[-1].label:
        return
    sync_roles(kwargs.get("apps") or project_apps)
