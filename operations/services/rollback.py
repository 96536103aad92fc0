"""A profile's revisions, from the audit log, and "roll back to revision N" as an operation.

Every save that changed what a profile runs raised its revision and wrote an
audit entry holding the profile after it (``audit.services.snapshot``): those
entries are the revisions. A rollback sets what runs (``SERVING_FIELDS``)
back to revision N's and saves it through ``profile_save`` as a new revision,
so it passes every check a resize does (declared, the launch policy, the
memory fit, no restart running) and is audited. Then, in the same
transaction, each replica not on the new revision is either adopted or
restarted:

- **Adopted** (its revision raised to the new one, no restart, an ``adopt``
  audit entry saying so) only when the command it runs is known to be the one
  the restored profile would start: the audit log holds its own revision, whose
  serving settings equal the restored ones field by field (secrets compared by
  the fingerprint the log holds), and nothing else that goes into the launch
  command has changed since. The serving fields are not all of the command:
  the launch policy writes the model's source and name, the port and the TP
  width in front of the profile's arguments, and the agent gets the cards. So
  when a restart started the replica, the spec it sent (``RestartStep.spec``,
  exact) must equal the spec the restored profile gives that replica now,
  which also catches a launch policy that now writes other arguments; when none
  did (a replica recorded by hand or by the demo), the model's source must be
  the one it had when that revision was saved (the model's audit entries say
  so), and the launch policy is taken to be the one deployed now, since
  nothing records the one it was started under. The model's shape is not part
  of the command: it enters the memory check, which the save runs on the
  restored settings either way.
- **Restarted**, through ``restart_start`` as a resize's replicas are, in every
  other case, each with the reason: other settings, a revision the audit log
  does not hold (not guessed), another source or spec, or a node that does not
  answer. The restart plays the whole restart through first (the adopted
  replicas keep their cards in it), and refuses, so that nothing is saved,
  when a replica has no place.

A dry run does all of it and rolls the transaction back, so the plan it shows
(adopted, restarted and where) is the one the rollback would carry out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.db import transaction
from llmgw_policy import GroupSpec

from audit.models import AuditEntry
from audit.summary import label
from base.actor import Actor
from base.errors import DomainError, conflict, not_found
from base.secrets import fingerprint_matches, is_fingerprint
from catalog.models import GPUClass, Profile, Replica, ServedModel, restartable_replicas_q, stale_replicas_q
from catalog.services.catalog import SERVING_FIELDS, profile_save, replica_save
from operations.models import RestartStep
from operations.services.specs import build_spec, started_spec
from operations.services.start import restart_start
from planning import engines

# What the agent compares to call two specs the same (docs/agent-api.md, PUT /v1/replicas/{id}).
SAME_SPEC_FIELDS = ("engine", "model", "args", "env", "cards", "port")


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


def _restore_env(profile: Profile, logged: dict[str, Any], revision: int) -> dict[str, str]:
    """Revision N's environment. Secrets are in the log only as fingerprints: one whose fingerprint
    is the current value's is restored as that value; another cannot be restored, and is refused."""
    env = {}
    for key, value in logged.items():
        if is_fingerprint(value):
            current = profile.env.get(key)
            if isinstance(current, str) and fingerprint_matches(current, value):
                env[key] = current
                continue
            raise conflict(
                "secret_unknown",
                f"Revision {revision} of {profile} ran another {key} than it has now, and that value cannot "
                f"be put back: {key} is a secret, which the audit log keeps only as its fingerprint "
                f"({value}). Set {key} again to revision {revision}'s value (the profile's form in the "
                f"admin, or PATCH /api/profiles/{profile.pk}/ with its env), then roll back; nothing "
                "was changed.",
            )
        env[key] = value
    return env


@dataclass(frozen=True)
class Adopted:
    """A replica that runs the restored settings already: it takes the new revision without a restart."""

    replica: str
    runs: int  # the revision it ran, whose settings are the restored ones


@dataclass(frozen=True)
class Restarted:
    """A replica the rollback restarts, why it cannot be adopted, and where the plan puts it."""

    replica: str
    runs: int
    why: str
    node: str = ""
    cards: tuple[int, ...] = ()
    in_place: bool | None = None
    # A replica across nodes: where the plan puts each rank, (rank, node, cards); () on one node
    # (``node`` and ``cards`` say it, and are rank 0's of a group).
    ranks: tuple[tuple[int, str, tuple[int, ...]], ...] = ()


@dataclass(frozen=True)
class Rollback:
    profile: Profile
    from_revision: int
    to_revision: int  # the revision whose settings it restores
    new_revision: int
    operation: int | None  # the restart it started, if any replica had to be (None on a dry run)
    adopted: tuple[Adopted, ...] = field(default=())
    restarted: tuple[Restarted, ...] = field(default=())


def _differing(a: dict[str, Any], b: dict[str, Any], fields: tuple[str, ...]) -> list[str]:
    return [label(f) for f in fields if a.get(f) != b.get(f)]


def _source_when(model: ServedModel, entry: AuditEntry) -> str:
    """The model's source when ``entry`` was written, as its own audit entries tell: the "before" of
    the first entry of it after that one which records a source; the source now when none does."""
    later = AuditEntry.objects.filter(object_type="model", object_key=model.name, pk__gt=entry.pk).order_by(
        "pk"
    )
    for e in later.iterator():
        if isinstance(e.before, dict) and "source" in e.before:
            return str(e.before["source"])
    return model.source


def _why_restart(
    replica: Replica,
    *,
    known: dict[int, Revision],
    restored: Revision,
    saved: Profile,
    model: ServedModel,
) -> str | None:
    """Why ``replica`` must be restarted onto the restored settings; None when it runs them already
    (the module's docstring says the rule)."""
    if replica.state == Replica.State.UNKNOWN:
        return "its node's agent does not answer, so what it runs is not known"
    runs = known.get(replica.revision)
    if runs is None:
        return (
            f"the audit log holds no entry for revision {replica.revision}, which it runs, so its settings "
            "are not known (not guessed)"
        )
    other = _differing(runs.settings, restored.settings, SERVING_FIELDS)
    if other:
        return f"it runs revision {runs.number}'s settings, which differ in {', '.join(other)}"
    started = started_spec(replica)
    if started is None:
        then = _source_when(model, runs.entry)
        if then != model.source:
            return (
                f"the model's source was {then} when revision {runs.number} was saved and is {model.source} "
                "now: a restart launches the new one"
            )
        return None
    # A group's spec on record is rank 0's: the restored settings' is built as that rank's, its rank
    # flags and the group's TP width (engines.group_widths) included.
    group = GroupSpec(**started["group"]) if isinstance(started.get("group"), dict) else None
    try:
        tp = (
            engines.group_widths(engines.engine(saved.engine), saved.tp, group.size)[0] if group else saved.tp
        )
        now = build_spec(
            engine=saved.engine,
            tp=tp,
            args=saved.args,
            env=saved.env,
            model=model,
            port=int(started.get("port") or replica.port),
            cards=list(started.get("cards") or []),
            ready_timeout=float(started.get("ready_timeout") or 600),
            group=group,
        )
    except DomainError as err:
        return f"the restored settings cannot be launched as it was: {err.message}"
    other = _differing(started, now, SAME_SPEC_FIELDS)
    if other:
        return (
            f"the command it was started with differs from the one the restored settings start now "
            f"in its {', '.join(other)} (the model's source or the launch policy changed since)"
        )
    return None


def _restore(current: Profile, target: Revision) -> None:
    settings = target.settings
    for name in ("gpus_per_node", "tp", "nodes", "pp", "engine", "args"):
        setattr(current, name, settings[name])
    current.env = _restore_env(current, settings["env"] or {}, target.number)
    gpu_class = settings["gpu_class"]
    current.gpu_class = None if gpu_class is None else GPUClass.objects.filter(name=gpu_class).first()
    if gpu_class is not None and current.gpu_class is None:
        raise DomainError(
            "invalid",
            f"Revision {target.number} ran on GPU class {gpu_class}, which is no longer in the catalog: add "
            f"GPU class {gpu_class} again (with its cards) first, or roll back to a revision on a class the "
            "catalog has.",
        )


def profile_rollback(
    *,
    model: str,
    profile: str,
    revision: int,
    dry_run: bool = False,
    actor: Actor | None = None,
) -> Rollback:
    """Set ``model``/``profile`` back to what ``revision`` ran, as a new revision; adopt the replicas
    that run those settings already and restart the others. Refuses (DomainError, nothing saved) as
    a resize would, when a replica to restart has no place, or when nothing would change."""
    with transaction.atomic():
        served = ServedModel.objects.select_for_update().filter(name=model).first()
        if served is None:
            raise not_found(f"No model {model!r} in the catalog.")
        current = (
            Profile.objects.select_related("model", "gpu_class").filter(model=served, name=profile).first()
        )
        if current is None:
            raise not_found(f"{model} has no profile {profile!r}.")
        known = {r.number: r for r in revisions(current)}
        target = revision_of(current, revision)
        was = current.revision
        if revision == was:
            raise conflict("unchanged", f"{current} is at revision {revision} already: nothing to roll back.")
        _restore(current, target)
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
        # The replicas a restart of stale ones takes.
        stale = restartable_replicas_q() & stale_replicas_q()
        behind = Replica.objects.filter(stale, profile=saved).order_by("name")
        adopted: list[Adopted] = []
        to_restart: list[Restarted] = []
        for replica in behind:
            why = _why_restart(replica, known=known, restored=target, saved=saved, model=served)
            if why is not None:
                to_restart.append(Restarted(replica.name, replica.revision, why))
                continue
            runs = replica.revision
            replica.revision = saved.revision
            replica_save(
                instance=replica,
                action="adopt",
                actor=actor,
                message=f"{saved}: replica {replica.name} adopted revision {saved.revision} without a "
                f"restart: it runs revision {runs}'s settings, the same",
            )
            adopted.append(Adopted(replica.name, runs))
        operation = None
        if to_restart:
            operation = restart_start(
                model_name=served.name,
                replicas=[r.replica for r in to_restart],
                actor=actor,
                cause=f"rollback of {saved} to revision {revision}'s settings (revision {was} → "
                f"{saved.revision})",
            ).pk
            planned = RestartStep.objects.filter(operation_id=operation).values_list(
                "old_replica__name", "planned_node", "planned_cards", "planned_in_place", "planned_ranks"
            )
            places = {
                name: (
                    node,
                    tuple(cards),
                    in_place,
                    tuple((int(r["rank"]), str(r["node"]), tuple(r["cards"])) for r in ranks or []),
                )
                for name, node, cards, in_place, ranks in planned
            }
            to_restart = [Restarted(r.replica, r.runs, r.why, *places[r.replica]) for r in to_restart]
        if dry_run:
            transaction.set_rollback(True)
            operation = None  # rolled back with the rest: there is no such operation
        return Rollback(saved, was, revision, saved.revision, operation, tuple(adopted), tuple(to_restart))


def plan_lines(done: Rollback) -> list[str]:
    """What the rollback does (or would do) to each replica, one line each, in the operators' words."""
    lines = [
        f"{a.replica}: adopts revision {done.new_revision} without a restart (it runs revision {a.runs}'s "
        "settings, the same)"
        for a in done.adopted
    ]
    for r in done.restarted:
        how = " in place" if r.in_place else " beside it" if r.in_place is False else ""
        if r.ranks:
            places = "; ".join(
                f"rank {rank} on {node} card(s) {', '.join(str(c) for c in cards)}"
                for rank, node, cards in r.ranks
            )
            where = f" across nodes ({places}){how}"
        else:
            where = f" on {r.node} card(s) {', '.join(str(c) for c in r.cards)}{how}" if r.node else ""
        lines.append(f"{r.replica}: restarted{where}: {r.why}")
    return lines
