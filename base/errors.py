"""The one way a domain operation fails: a code, a plain sentence, a status.

Raised by the pure planning rules and by services; rendered by one DRF
exception handler, one htmx partial and every management command.
"""

from __future__ import annotations

from typing import Any


class DomainError(Exception):
    """A refusal the operator can act on.

    ``code`` is stable and machine-readable, ``message`` a plain sentence that
    says what is wrong and how to fix it, ``status`` the HTTP status the API
    answers with, and ``change`` whatever part of the change was worked out
    before the refusal (the API returns it beside the error).
    """

    def __init__(self, code: str, message: str, *, status: int = 400, change: dict[str, Any] | None = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status
        self.change = change

    def as_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {"detail": self.message, "code": self.code}
        if self.change is not None:
            body["change"] = self.change
        return body

    def __repr__(self) -> str:
        return f"DomainError({self.code!r}, {self.message!r}, status={self.status})"


def not_found(message: str) -> DomainError:
    return DomainError("not_found", message, status=404)


def conflict(code: str, message: str, **kw: Any) -> DomainError:
    return DomainError(code, message, status=409, **kw)


def declared(model: str, settings_file: str) -> DomainError:
    """The refusal of any change to a model the cluster's settings file declares, wherever it is asked."""
    return conflict(
        "declared",
        f"Model {model} is declared in the cluster's settings ({settings_file}) and is read-only here: "
        "change it in that file, then run `python manage.py sync_cluster_settings`.",
    )
