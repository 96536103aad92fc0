"""Restarts: an operation kept in the database, one step per replica, run by a worker.

How an operation is claimed, kept alive and taken over is explained in
``operations/services/lease.py``; what a step does, in
``operations/services/runner/``; the whole story in docs/design.md, "Restarts".
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from audit.models import Via
from catalog.models import Node, Profile, Replica, ServedModel


class RestartOperation(models.Model):
    class State(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        PARTLY_FAILED = "partly_failed", "partly failed"
        CANCELLED = "cancelled"

    ACTIVE_STATES = ("queued", "running")

    model = models.ForeignKey(ServedModel, on_delete=models.CASCADE, related_name="restarts")
    profile = models.ForeignKey(Profile, on_delete=models.CASCADE, related_name="restarts")
    state = models.CharField(max_length=16, choices=State.choices, default=State.QUEUED, db_index=True)
    in_place = models.BooleanField(
        null=True,
        blank=True,
        help_text="True: every replica stops before its replacement starts. False: rolling only (a step with "
        "no room beside fails). Empty: rolling where a node has room beside, in place where not.",
    )
    max_parallel = models.PositiveSmallIntegerField(default=1, help_text="Steps run at once.")
    ready_timeout = models.FloatField(default=600, help_text="Seconds a replacement has to become ready.")
    settle_seconds = models.FloatField(
        default=0,
        help_text="Seconds a replacement must stay ready before its old replica is stopped "
        "(as Kubernetes' minReadySeconds).",
    )
    stop_at_first_failure = models.BooleanField(
        default=False,
        help_text="Start no new step once one failed. By default the other replicas are still restarted: "
        "a fault on one node should not leave the rest of the model on the old revision.",
    )
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        related_name="+",
        # Like the audit log: an account with a history is deactivated, not deleted.
        on_delete=models.PROTECT,
    )
    requested_by_name = models.CharField(
        max_length=150, help_text="Who asked, copied (user, or command's name)."
    )
    via = models.CharField(max_length=8, choices=Via.choices)
    reason = models.TextField(blank=True, default="", help_text="Why it ended as it did, in a sentence.")
    cause = models.CharField(
        max_length=300,
        blank=True,
        default="",
        help_text="What asked for it: the resize or context change, the stale replicas, the replicas named.",
    )
    target_revision = models.PositiveIntegerField(
        null=True, blank=True, help_text="The profile revision its replacements run."
    )
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True, help_text="Last sign of life of its worker.")
    worker = models.CharField(max_length=200, blank=True, default="", help_text="The worker holding it.")
    attempts = models.PositiveSmallIntegerField(default=0, help_text="Times a worker claimed it.")
    cancel_requested = models.BooleanField(default=False)
    serving_after = models.PositiveIntegerField(
        null=True, blank=True, help_text="Replicas of the model ready when it ended."
    )
    task_id = models.CharField(
        max_length=64, blank=True, default="", help_text="The latest task enqueued for it."
    )

    class Meta:
        ordering = ["-id"]
        verbose_name = "restart operation"
        constraints = [
            models.CheckConstraint(
                condition=Q(
                    state__in=["queued", "running", "succeeded", "failed", "partly_failed", "cancelled"]
                ),
                name="restart_state_valid",
            ),
            models.CheckConstraint(condition=Q(max_parallel__gte=1), name="restart_max_parallel_positive"),
            models.CheckConstraint(condition=Q(ready_timeout__gt=0), name="restart_ready_timeout_positive"),
            models.CheckConstraint(condition=Q(settle_seconds__gte=0), name="restart_settle_not_negative"),
            # One restart of a model at a time, whoever asks and however.
            models.UniqueConstraint(
                fields=["model"],
                condition=Q(state__in=["queued", "running"]),
                name="restart_one_active_per_model",
            ),
        ]

    def __str__(self) -> str:
        return f"restart #{self.pk} of {self.model.name}"

    @property
    def is_active(self) -> bool:
        return self.state in self.ACTIVE_STATES

    @property
    def abandoned_seconds(self) -> float | None:
        """How long no worker has held it, when none does: running with a heartbeat older than
        LLMGW_OPERATION_STALE_SECONDS, or queued for longer than that; None otherwise."""
        if not self.is_active:
            return None
        since = self.heartbeat_at if self.state == self.State.RUNNING else self.created_at
        if since is None:
            since = self.started_at or self.created_at
        idle = (timezone.now() - since).total_seconds()
        return idle if idle > settings.LLMGW_OPERATION_STALE_SECONDS else None

    @property
    def abandoned_text(self) -> str:
        """ "abandoned: no worker has it" with how long, or "" while a worker holds it."""
        idle = self.abandoned_seconds
        if idle is None:
            return ""
        return (
            f"abandoned: no worker has it ({'no heartbeat' if self.state == self.State.RUNNING else 'queued'} "
            f"for {_duration(idle)}): start a worker (python manage.py db_worker), which takes it over"
        )

    @property
    def mode(self) -> str:
        """In the operators' words: how replicas are replaced."""
        if self.in_place:
            return "in place"
        return "rolling" if self.in_place is False else "rolling where there is room, else in place"


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"


class AgentContact(models.Model):
    """When a node's agent last answered the reconciler (``Node.last_seen_at`` reads it).

    A reading, not a change: written on every pass without an audit entry, so it is kept apart from
    the catalog's tables, whose every row change the database records and the audit log must explain.
    """

    node = models.OneToOneField(
        Node, on_delete=models.CASCADE, primary_key=True, related_name="agent_contact"
    )
    last_seen_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.node.name}: last seen {self.last_seen_at:%Y-%m-%d %H:%M:%S}"


class ReleaseCheck(models.Model):
    """One answer of the release watch (``manage.py engine_releases``, the daily task): each
    engine's newest release on the package index beside the fleet's default. A reading, not a
    change to the fleet: written without an audit entry, kept outside the catalog."""

    checked_at = models.DateTimeField(default=timezone.now, db_index=True)
    index_url = models.CharField(max_length=500)
    results = models.JSONField(
        default=list,
        blank=True,
        help_text="One entry per engine: engine, package, default, newest, newer (bool), error.",
    )

    class Meta:
        ordering = ["-checked_at"]

    def __str__(self) -> str:
        return f"release check {self.checked_at:%Y-%m-%d %H:%M}"


class RestartStep(models.Model):
    """One replica of an operation: its replacement, where it runs, and how it went."""

    class State(models.TextChoices):
        PENDING = "pending"
        STARTING = "starting"
        WAITING = "waiting"
        STOPPING = "stopping"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        CANCELLED = "cancelled"

    IN_FLIGHT_STATES = ("starting", "waiting", "stopping")
    FINISHED_STATES = ("succeeded", "failed", "cancelled")

    operation = models.ForeignKey(RestartOperation, on_delete=models.CASCADE, related_name="steps")
    old_replica = models.ForeignKey(
        Replica, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    new_replica = models.ForeignKey(
        Replica, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # Where the plan put the replacement when the restart started (planning/placement.py);
    # the step follows it, and fails saying so when the fleet changed under it.
    planned_node = models.CharField(max_length=64, blank=True, default="")
    planned_cards = models.JSONField(default=list, blank=True)
    planned_in_place = models.BooleanField(null=True, blank=True)
    # A replica across nodes (docs/restarts.md, "A group"): where the plan put each rank
    # ([{"rank", "node", "cards"}]), where each rank of the replacement runs with the spec its
    # agent is sent and the state its agent last said ([{"rank", "node", "cards", "spec", "state",
    # "reason"}]), and the old replica's ranks with their specs, to start again when an in-place
    # step fails. Empty on a replica that fits one node: ``node``, ``cards`` and the specs say it.
    # ``node`` and ``cards`` keep rank 0's, ``spec`` and ``old_spec`` rank 0's spec.
    planned_ranks = models.JSONField(default=list, blank=True)
    ranks = models.JSONField(
        default=list, blank=True, help_text="Each rank of the replacement, across nodes."
    )
    old_ranks = models.JSONField(
        default=list, blank=True, help_text="Each rank of the old replica, across nodes."
    )
    node = models.CharField(max_length=64, blank=True, default="", help_text="Where the replacement runs.")
    cards = models.JSONField(
        default=list, blank=True, help_text="Card indices of the replacement on its node."
    )
    in_place = models.BooleanField(
        default=False, help_text="The old replica was stopped first, freeing its cards."
    )
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    reason = models.TextField(blank=True, default="")
    # The specs sent to the agents: the replacement's, so that a worker taking
    # over sends the very same one (a repeated PUT is then harmless), and the
    # old replica's, so that an in-place step that fails can start it again.
    spec = models.JSONField(null=True, blank=True)
    old_spec = models.JSONField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["operation_id", "id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(
                    state__in=[
                        "pending",
                        "starting",
                        "waiting",
                        "stopping",
                        "succeeded",
                        "failed",
                        "cancelled",
                    ]
                ),
                name="restart_step_state_valid",
            ),
        ]

    def __str__(self) -> str:
        old = self.old_replica.name if self.old_replica is not None else "?"
        return f"restart #{self.operation_id}: {old} ({self.state})"

    @property
    def is_finished(self) -> bool:
        return self.state in self.FINISHED_STATES
