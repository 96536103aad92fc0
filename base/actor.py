"""Who is acting: a context variable set at every entry point.

Middleware sets it for pages, the admin and the API; each management command
and the worker set it for themselves. The audit write path reads it, so no
service has to be handed the request (NetBox's change logging works this way).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django.db import models

if TYPE_CHECKING:
    from django.http import HttpRequest


class Via(models.TextChoices):
    """Through which door a change came: the one list the audit log, restarts and the actor share."""

    UI = "ui", "pages"
    API = "api", "API"
    ADMIN = "admin", "admin"
    CLI = "cli", "command"
    WORKER = "worker", "worker"


@dataclass(frozen=True)
class Actor:
    """The one acting. ``request`` is kept for its user, resolved at write time,

    because DRF authenticates (token, session) inside the view, after the
    middleware ran: the user is only known by the time a service writes.
    """

    via: str
    name: str = ""
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    user: Any = None
    request: HttpRequest | None = None

    def __post_init__(self) -> None:
        if self.via not in Via.values:
            raise ValueError(f"via must be one of {', '.join(Via.values)}, not {self.via!r}")

    @property
    def resolved_user(self) -> Any:
        user = self.user
        if user is None and self.request is not None:
            user = getattr(self.request, "user", None)
        if user is not None and getattr(user, "is_authenticated", False):
            return user
        return None

    @property
    def display_name(self) -> str:
        user = self.resolved_user
        if user is not None:
            return user.get_username()
        return self.name or "anonymous"


_current: ContextVar[Actor | None] = ContextVar("llmgw_actor", default=None)


def current_actor() -> Actor:
    """The actor set by the entry point; refuses to guess when none was set."""
    actor = _current.get()
    if actor is None:
        raise RuntimeError(
            "no actor is set: wrap the change in base.actor.acting_as(...) "
            "(middleware, commands and the worker do this)"
        )
    return actor


@contextlib.contextmanager
def acting_as(actor: Actor) -> Iterator[Actor]:
    token = _current.set(actor)
    try:
        yield actor
    finally:
        _current.reset(token)
