"""A profile's revisions, from the audit log, and "roll back to revision N" as an operation.

Every save that changed what a profile runs raised its revision and wrote an
audit entry holding the profile after it (``audit.services.snapshot``): those
entries are the revisions. A rollback sets what runs (``SERVING_FIELDS``)
back to revision N's and saves it through ``profile_save`` as a new revision,
so it passes every check a resize does (declared, the launch policy, the
memory fit, no restart running) and is audited, then restarts the stale
replicas in the same transaction, as a resize does; the restart's placement
refuses, and nothing is saved, when there is no room.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import transaction

from audit.actor import Actor
from audit.models import AuditEntry
from catalog.errors import DomainError, conflict, not_found
from catalog.models import GPUClass, Profile, ServedModel, stale_replicas_q
from catalog.secrets import fingerprint
from catalog.selectors import live_replicas
from catalog.services.catalog import SERVING_FIELDS, profile_save
from operations.services.start import restart_start


@dataclass(frozen=True)
class Revision:
    number: int
    entry: AuditEntry  # the entry that recorded the profile at this revision

    @property
    def settings(self) -> dict[str, Any]:
        after = self.entry.after or {}
        return {f: after.get(f) for f in SERVING_FIELDS}


def revisions(profile: Profile) -> list[Revision]:
    """The profile's revisions the audit log holds, newest first (the latest entry for each number)."""
    seen: dict[int, Revision] = {}
    entries = AuditEntry.objects.filter(object_type="profile", object_key=str(profile)).order_by("-id")
    for entry in entries.iterator():
        number = (entry.after or {}).get("revision")
        if isinstance(number, int) and number not in seen:
            seen[number] = Revision(number, entry)
    return sorted(seen.values(), key=lambda r: -r.number)


def revision_of(profile: Profile, number: int) -> Revision:
    for revision in revisions(profile):
        if revision.number == number:
            return revision
    raise not_found(
        f"{profile} has no revision {number} in the audit log: its revisions there are "
        f"{', '.join(str(r.number) for r in revisions(profile)) or 'none'}."
    )


def _restore_env(profile: Profile, logged: dict[str, Any]) -> dict[str, str]:
    """Revision N's environment. Secrets are in the log only as fingerprints: one whose fingerprint
    is the current value's is restored as that value; another cannot be restored, and is refused."""
    env = {}
    for key, value in logged.items():
        if isinstance(value, str) and value.startswith("sha256:"):
            current = profile.env.get(key)
            if isinstance(current, str) and fingerprint(current) == value:
                env[key] = current
                continue
            raise DomainError(
                "secret_unknown",
                f"Revision's {key} was a secret the audit log holds only as {value}, and it is not the current "
                f"value: set {key} by hand on {profile}, then roll back.",
            )
        env[key] = value
    return env


@dataclass(frozen=True)
class Rollback:
    profile: Profile
    from_revision: int
    to_revision: int  # the revision whose settings it restores
    new_revision: int
    operation: int | None  # the restart it started, if any replica was stale


def profile_rollback(
    *,
    model: str,
    profile: str,
    revision: int,
    dry_run: bool = False,
    actor: Actor | None = None,
) -> Rollback:
    """Set ``model``/``profile`` back to what ``revision`` ran, as a new revision, and restart its stale
    replicas. Refuses (DomainError, nothing saved) as a resize would, or when nothing would change."""
    with transaction.atomic():
        served = ServedModel.objects.select_for_update().filter(name=model).first()
        if served is None:
            raise not_found(f"No model {model!r} in the catalog.")
        current = (
            Profile.objects.select_related("model", "gpu_class").filter(model=served, name=profile).first()
        )
        if current is None:
            raise not_found(f"{model} has no profile {profile!r}.")
        target = revision_of(current, revision)
        settings = target.settings
        was = current.revision
        for field in ("gpus_per_node", "tp", "nodes", "pp", "engine", "args"):
            setattr(current, field, settings[field])
        current.env = _restore_env(current, settings["env"] or {})
        name = settings["gpu_class"]
        current.gpu_class = None if name is None else GPUClass.objects.filter(name=name).first()
        if name is not None and current.gpu_class is None:
            raise DomainError(
                "invalid", f"Revision {revision} ran on GPU class {name}, which is no longer in the catalog."
            )
        if revision == was:
            raise conflict("unchanged", f"{current} is at revision {revision} already: nothing to roll back.")
        saved = profile_save(
            instance=current,
            action="rollback",
            message=f"{current}: rolled back to revision {revision}'s settings (was revision {was})",
            actor=actor,
            # The context flag of an earlier revision was the context operation's, and goes back with it.
            context_from_operation=True,
        )
        if saved.revision == was:
            raise conflict(
                "unchanged",
                f"{current} at revision {was} already runs what revision {revision} ran: nothing to roll back.",
            )
        stale = list(live_replicas(saved).filter(stale_replicas_q()).values_list("name", flat=True))
        operation = restart_start(model_name=served.name, replicas=stale, actor=actor).pk if stale else None
        result = Rollback(saved, was, revision, saved.revision, operation)
        if dry_run:
            transaction.set_rollback(True)
        return result
