"""``check --deploy``: the audit log's guarantees hold only when the deployment is set up for them."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks
from django.db import DatabaseError, connection

from audit.models import AuditEntry

HOW = (
    "README, 'The database's two roles': migrate as the owner, then run the app as a role that owns nothing."
)


def app_role_problem() -> str | None:
    """Why the connected role could lift the audit log's triggers, or None when it cannot (PostgreSQL only)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT t.tableowner, r.rolsuper, pg_has_role(current_user, t.tableowner, 'MEMBER'), current_user "
            "FROM pg_tables t JOIN pg_roles r ON r.rolname = current_user "
            "WHERE t.tablename = %s AND t.schemaname = current_schema()",
            [AuditEntry._meta.db_table],
        )
        row = cursor.fetchone()
    if row is None:
        return None  # not migrated yet: nothing to judge
    owner, superuser, member, me = row
    if superuser:
        return f"the application connects as {me}, a superuser, who can switch the audit log's triggers off"
    if member:
        return f"the application connects as {me}, which owns the audit table (as {owner}) and can drop its triggers"
    return None


@checks.register(checks.Tags.security, deploy=True)
def audit_deploy(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    found: list[checks.CheckMessage] = []
    if not settings.LLMGW_AUDIT_KEY:
        found.append(
            checks.Warning(
                "LLMGW_AUDIT_KEY is not set: the audit chain's key is derived from DJANGO_SECRET_KEY, so rotating "
                "the secret key would make every entry fail audit_verify.",
                hint="Set LLMGW_AUDIT_KEY to 32 or more random characters, kept out of the database, and never change it.",
                id="audit.W001",
            )
        )
    if connection.vendor == "postgresql":
        try:
            problem = app_role_problem()
        except DatabaseError as exc:
            problem = None
            found.append(checks.Info(f"Could not read the audit table's owner: {exc}", id="audit.I002"))
        if problem:
            found.append(
                checks.Warning(
                    f"{problem}: append-only is not enforced against it.", hint=HOW, id="audit.W002"
                )
            )
    else:
        found.append(
            checks.Info(
                f"On {connection.vendor}, the audit log's triggers refuse UPDATE and DELETE, but any writer of the "
                "file can drop them, and the catalog's row-change triggers are not installed: use PostgreSQL "
                "with two roles for append-only that holds against database access.",
                id="audit.I001",
            )
        )
    return found
