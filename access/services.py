"""API tokens: made, revoked; each audited. Only knox's hash of the secret is kept."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction

from access.models import Token
from audit.services import audit_record
from base.errors import DomainError

NAME_MAX = Token._meta.get_field("name").max_length or 100


def _snapshot(token: Token) -> dict[str, Any]:
    # The key is the secret's first characters (knox's lookup), not the secret: it names the token.
    return {
        "user": token.user.get_username(),
        "name": token.name,
        "key": token.token_key,
        "expiry": token.expiry,
    }


def token_create(*, user: Any, name: str, days: int) -> tuple[Token, str]:
    """A token for ``user`` that expires in ``days``; returns it and its secret, which is shown once."""
    name = (name or "").strip()
    if not name or len(name) > NAME_MAX:
        raise DomainError(
            "invalid", f"A token needs a name of 1 to {NAME_MAX} characters saying what uses it."
        )
    top = settings.LLMGW_TOKEN_MAX_DAYS
    if not isinstance(days, int) or isinstance(days, bool) or not 1 <= days <= top:
        raise DomainError(
            "invalid",
            f"A token expires in 1 to {top} days, not {days!r} (LLMGW_TOKEN_MAX_DAYS sets the longest).",
        )
    try:
        with transaction.atomic():
            token, secret = Token.objects.create(user=user, expiry=timedelta(days=days), name=name)
            audit_record(
                action="create",
                object_type="token",
                object_key=f"{user.get_username()}/{name}",
                after=_snapshot(token),
            )
    except IntegrityError:
        raise DomainError(
            "exists",
            f"{user.get_username()} already has a token named {name!r}: pick another name.",
            status=409,
        ) from None
    return token, secret


def token_revoke(*, token: Token) -> None:
    """The token stops working at once."""
    with transaction.atomic():
        before = _snapshot(token)
        token.delete()
        audit_record(
            action="delete",
            object_type="token",
            object_key=f"{before['user']}/{before['name']}",
            before=before,
            message="revoked",
        )


def password_change(*, user: Any, new: str) -> None:
    """``user``'s password made ``new``, which must pass AUTH_PASSWORD_VALIDATORS (12 characters or
    more, not a common one, not like the user's name); audited, without the password. The caller has
    checked the current one (access/views.py, through the sign-in's limits). Every other session of
    the user ends: Django's session hash changes with the password."""
    from django.contrib.auth.password_validation import validate_password
    from django.core.exceptions import ValidationError

    try:
        validate_password(new, user)
    except ValidationError as exc:
        raise DomainError("weak_password", " ".join(exc.messages)) from None
    with transaction.atomic():
        user.set_password(new)
        user.save(update_fields=["password"])
        audit_record(
            action="update",
            object_type="user",
            object_key=user.get_username(),
            message="changed their password",
        )
