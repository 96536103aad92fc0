"""API tokens (django-rest-knox's, with a name) and the permissions that belong to no one model."""

from __future__ import annotations

from django.db import models
from knox.models import AbstractAuthToken


class Token(AbstractAuthToken):
    """An API token for automation: only its hash is kept (knox), it has a name and may expire."""

    name = models.CharField(max_length=100, help_text="What the token is for, e.g. 'ci-deploy'.")

    class Meta:
        ordering = ["-created"]
        default_permissions = ("view", "delete")
        constraints = [
            models.UniqueConstraint(fields=["user", "name"], name="token_name_unique_per_user"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.user})"


class Access(models.Model):
    """No table: carries the permissions of the site itself."""

    class Meta:
        managed = False
        default_permissions = ()
        permissions = [("open_admin", "Can open the admin site")]

    def __str__(self) -> str:
        return "access"
