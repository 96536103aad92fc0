"""The hardware: kinds of card, the nodes that hold them, and each card."""

from __future__ import annotations

from datetime import datetime
from urllib.parse import urlsplit

from django.core.validators import RegexValidator
from django.db import models
from django.db.models import Q

name_validator = RegexValidator(
    r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
    "Use letters, digits, dots, dashes and underscores, starting with a letter or digit.",
)
# Printable ASCII without spaces (it goes in an Authorization header), long enough not to be guessed:
# what `manage.py rotate_agent_token` makes (secrets.token_urlsafe(32), 43 characters) passes.
AGENT_TOKEN_MIN = 32
agent_token_validator = RegexValidator(
    rf"^[\x21-\x7e]{{{AGENT_TOKEN_MIN},200}}\Z",
    f"The agent token must be {AGENT_TOKEN_MIN} to 200 printable ASCII characters without spaces (letters, "
    "digits and punctuation), as the agent is given it: make one with python3 -c 'import secrets; "
    "print(secrets.token_urlsafe(32))', or let manage.py rotate_agent_token make and give it.",
)
capability_validator = RegexValidator(
    r"^\d{1,2}\.\d$", "Write the compute capability as major.minor, e.g. 9.0."
)


class GPUClass(models.Model):
    """A kind of card. ``usable_mib`` is what an engine may fill: the card budget."""

    name = models.CharField(max_length=64, unique=True, validators=[name_validator])
    memory_mib = models.PositiveIntegerField(
        help_text="Total memory of one card, in MiB (nvidia-smi's figure)."
    )
    usable_mib = models.PositiveIntegerField(help_text="What an engine may fill on one card, in MiB.")
    compute_capability = models.CharField(max_length=8, validators=[capability_validator])

    class Meta:
        ordering = ["name"]
        verbose_name = "GPU class"
        verbose_name_plural = "GPU classes"
        constraints = [
            models.CheckConstraint(condition=Q(memory_mib__gte=1), name="gpuclass_memory_positive"),
            models.CheckConstraint(
                condition=Q(usable_mib__gte=1) & Q(usable_mib__lte=models.F("memory_mib")),
                name="gpuclass_usable_within_memory",
                violation_error_message="Usable memory must be between 1 MiB and the card's total memory.",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def usable_bytes(self) -> int:
        return self.usable_mib * 2**20

    @property
    def capability_tuple(self) -> tuple[int, int]:
        major, minor = self.compute_capability.split(".")
        return int(major), int(minor)


class Node(models.Model):
    class State(models.TextChoices):
        READY = "ready"
        CORDONED = "cordoned"
        DOWN = "down"

    name = models.CharField(max_length=64, unique=True, validators=[name_validator])
    agent_url = models.URLField(help_text="Base URL of the node agent, e.g. http://10.0.0.5:9101")
    agent_token = models.CharField(
        max_length=200,
        validators=[agent_token_validator],
        help_text=f"Bearer token the node agent expects: {AGENT_TOKEN_MIN} to 200 printable ASCII characters.",
    )
    state = models.CharField(max_length=16, choices=State.choices, default=State.READY)
    # The nodes a replica across several may span (one InfiniBand or RoCE fabric, say): an editor's
    # field. Empty, the node joins no group across nodes: nothing says its fabric reaches another's.
    fabric_domain = models.CharField(
        max_length=64,
        blank=True,
        default="",
        validators=[name_validator],
        help_text="The fabric this node shares with others, e.g. ib-east-1: a replica across nodes spans "
        "only nodes of one domain. Empty: the node holds only replicas that fit it alone.",
    )
    # What the reconciler (operations/services/reconcile.py) last learnt from the node's agent: the
    # operator's state above says whether the node may be used, these whether its agent answers.
    reachable = models.BooleanField(
        default=True, help_text="Whether its agent answered the last time it was asked."
    )
    unreachable_reason = models.TextField(blank=True, default="", help_text="Why its agent did not answer.")
    orphans = models.JSONField(
        default=list,
        blank=True,
        help_text="Engines its agent runs that the catalog does not hold, for an operator to adopt or stop.",
    )
    # What its agent last said of the node itself (GET /v1/node, read by the reconciler): the
    # engines installed with their releases, the driver and CUDA versions nvidia-smi reports, the
    # machine's architecture, written (and audited) when they change. ``facts_at`` is None while its agent has never said: then none of
    # these is known, and the floors that need them are not checked there (docs/design.md, "Releases").
    driver_version = models.CharField(max_length=32, blank=True, default="", help_text="e.g. 580.65.06")
    cuda_version = models.CharField(
        max_length=16, blank=True, default="", help_text="The CUDA version the driver supports, e.g. 13.0."
    )
    arch = models.CharField(max_length=32, blank=True, default="", help_text="e.g. x86_64 or aarch64.")
    engines = models.JSONField(
        default=dict, blank=True, help_text="The engines installed: engine name to its release."
    )
    facts_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="When its agent's report last changed these facts (audited); empty: it never reported them.",
    )

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=Q(state__in=["ready", "cordoned", "down"]), name="node_state_valid"
            ),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def last_seen_at(self) -> datetime | None:
        """When its agent last answered the reconciler (``operations.models.AgentContact``: a reading
        written every pass, kept out of the catalog, whose every row change is audited)."""
        contact = getattr(self, "agent_contact", None)
        return contact.last_seen_at if contact is not None else None

    @property
    def agent_host(self) -> str:
        """The host its agent runs on, lower-case: nodes whose agents share a host share its ports."""
        return (urlsplit(self.agent_url).hostname or self.agent_url).lower()


class Card(models.Model):
    """One card in a node. It is free when no replica holds it (no Shard row)."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="cards")
    index = models.PositiveSmallIntegerField()
    gpu_class = models.ForeignKey(GPUClass, on_delete=models.PROTECT, related_name="cards")
    # A card taken out of placement on its own (a bad card: Xid or ECC errors), by card_cordon and
    # card_uncordon only (operations/services/drain.py), or by the telemetry when its agent reports
    # such errors; what runs on it keeps running.
    cordoned = models.BooleanField(
        default=False, help_text="No new replica is placed on it (card_cordon / card_uncordon)."
    )
    cordon_reason = models.CharField(
        max_length=300,
        blank=True,
        default="",
        help_text="Why it was cordoned, as the operator or telemetry said.",
    )

    class Meta:
        ordering = ["node__name", "index"]
        constraints = [
            models.UniqueConstraint(fields=["node", "index"], name="card_index_unique_on_node"),
        ]

    def __str__(self) -> str:
        return f"{self.node.name}#{self.index}"
