"""What is served: models with their shape, profiles, replicas and their cards."""

from __future__ import annotations

from django.db import models
from django.db.models import F, Q
from django.utils import timezone

from catalog.models.fleet import Card, GPUClass, name_validator


class ServedModel(models.Model):
    """A served model. Shape fields are None when unknown: checks that need them are skipped."""

    class Attention(models.TextChoices):
        MHA = "mha", "MHA"
        GQA = "gqa", "GQA"
        MQA = "mqa", "MQA"
        MLA = "mla", "MLA"

    name = models.CharField(max_length=128, unique=True, validators=[name_validator])
    source = models.CharField(max_length=500, help_text="Hugging Face repo id or a path on the nodes.")
    context_length = models.PositiveIntegerField(
        null=True, blank=True, help_text="Tokens the model supports."
    )
    # The shape, read from the model's config.json and safetensors index or headers (catalog/modelfiles).
    layers = models.PositiveIntegerField(null=True, blank=True)
    attention_heads = models.PositiveIntegerField(null=True, blank=True)
    kv_heads = models.PositiveIntegerField(null=True, blank=True)
    head_dim = models.PositiveIntegerField(null=True, blank=True)
    dtype = models.CharField(max_length=32, blank=True, default="")
    attention = models.CharField(max_length=8, choices=Attention.choices, blank=True, default="")
    kv_bytes_per_token = models.PositiveBigIntegerField(
        null=True,
        blank=True,
        help_text="KV cache per token for the whole model, every layer keeping every token.",
    )
    weight_bytes = models.PositiveBigIntegerField(null=True, blank=True)
    expert_bytes = models.PositiveBigIntegerField(
        null=True, blank=True, help_text="MoE routed-expert weights."
    )
    sliding_window = models.PositiveIntegerField(null=True, blank=True)
    sliding_layers = models.PositiveIntegerField(
        default=0, help_text="Layers that keep only the sliding window."
    )
    # What sizes the engine's activation peak (docs/memory-model.md).
    hidden_size = models.PositiveIntegerField(null=True, blank=True)
    intermediate_size = models.PositiveIntegerField(
        null=True, blank=True, help_text="The MLP's width (for MoE: the experts' times those active)."
    )
    vocab_size = models.PositiveIntegerField(null=True, blank=True)
    replicated_bytes = models.PositiveBigIntegerField(
        default=0,
        help_text="Weights every tensor-parallel card holds whole (router gates, MLA down-projections).",
    )
    expert_intermediate_size = models.PositiveIntegerField(
        null=True, blank=True, help_text="One routed expert's MLP width (moe_intermediate_size)."
    )
    expert_format = models.CharField(
        max_length=32,
        blank=True,
        default="",
        help_text="The routed experts' quantization (mxfp4): some engines pad such expert tensors.",
    )
    experts_per_token = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Routed experts a token goes through (num_experts_per_tok): sizes the engine's MoE buffers.",
    )
    declared = models.BooleanField(
        default=False, help_text="Comes from the cluster settings file; read-only here."
    )
    declared_in = models.CharField(max_length=500, blank=True, default="")

    class Meta:
        ordering = ["name"]
        verbose_name = "model"
        db_table = "catalog_model"
        permissions = [
            ("resize_model", "Can resize a model or change its context"),
            ("restart_model", "Can restart a model's replicas"),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(context_length__isnull=True) | Q(context_length__gte=1),
                name="model_context_positive",
            ),
            models.CheckConstraint(
                condition=Q(layers__isnull=True) | Q(layers__gte=1), name="model_layers_positive"
            ),
            models.CheckConstraint(
                condition=Q(attention_heads__isnull=True) | Q(attention_heads__gte=1),
                name="model_heads_positive",
            ),
            models.CheckConstraint(
                condition=Q(kv_heads__isnull=True) | Q(kv_heads__gte=1), name="model_kv_heads_positive"
            ),
            models.CheckConstraint(
                condition=Q(head_dim__isnull=True) | Q(head_dim__gte=1), name="model_head_dim_positive"
            ),
            models.CheckConstraint(
                condition=Q(weight_bytes__isnull=True) | Q(weight_bytes__gte=1), name="model_weights_positive"
            ),
            models.CheckConstraint(
                condition=Q(sliding_window__isnull=True) | Q(sliding_window__gte=1),
                name="model_window_positive",
            ),
        ]

    def __str__(self) -> str:
        return self.name


class Profile(models.Model):
    """How a model is served. ``revision`` goes up on every change; replicas record the one they run."""

    model = models.ForeignKey(ServedModel, on_delete=models.CASCADE, related_name="profiles")
    name = models.CharField(max_length=64, validators=[name_validator])
    engine = models.CharField(max_length=32)
    engine_version = models.CharField(
        max_length=64,
        blank=True,
        default="",
        help_text="The engine's release, e.g. 0.19.1. Empty: the fleet's default release of the engine.",
    )
    gpu_class = models.ForeignKey(
        GPUClass,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="profiles",
        help_text="Empty: runs on CPUs only.",
    )
    gpus_per_node = models.PositiveSmallIntegerField(default=1)
    tp = models.PositiveSmallIntegerField(default=1, verbose_name="tensor-parallel width")
    nodes = models.PositiveSmallIntegerField(default=1)
    pp = models.PositiveSmallIntegerField(default=0, verbose_name="pipeline stages")
    args = models.JSONField(default=list, blank=True, help_text="Engine arguments, a list of strings.")
    env = models.JSONField(default=dict, blank=True, help_text="Environment variables, a mapping of strings.")
    revision = models.PositiveIntegerField(default=1)

    class Meta:
        ordering = ["model__name", "name"]
        constraints = [
            models.UniqueConstraint(fields=["model", "name"], name="profile_name_unique_per_model"),
            models.CheckConstraint(condition=Q(gpus_per_node__gte=1), name="profile_gpus_per_node_positive"),
            models.CheckConstraint(condition=Q(tp__gte=1), name="profile_tp_positive"),
            models.CheckConstraint(condition=Q(nodes__gte=1), name="profile_nodes_positive"),
            models.CheckConstraint(condition=Q(revision__gte=1), name="profile_revision_positive"),
        ]

    def __str__(self) -> str:
        return f"{self.model.name}/{self.name}"

    @property
    def cards(self) -> int:
        return max(self.gpus_per_node, self.tp, 1) * max(self.nodes, self.pp, 1)


class EngineDefault(models.Model):
    """The fleet's default release of an engine: what a profile with no release of its own runs.
    Changed through ``catalog.services.releases`` (audited), after an upgrade's dry run."""

    engine = models.CharField(max_length=32, unique=True)
    version = models.CharField(max_length=64, help_text="The release, e.g. 0.19.1.")

    class Meta:
        ordering = ["engine"]
        verbose_name = "engine default release"

    def __str__(self) -> str:
        return f"{self.engine} {self.version}"


class Replica(models.Model):
    class State(models.TextChoices):
        STARTING = "starting"
        LOADING = "loading"
        READY = "ready"
        # Asked to stop, and the agent has not confirmed it: it keeps its cards until it does
        # (the runner and the reconciler ask again).
        STOPPING = "stopping"
        # Its node's agent does not answer: it may run or not; it keeps its cards.
        UNKNOWN = "unknown"
        FAILED = "failed"
        STOPPED = "stopped"

    # Coming up: asked to start, not ready yet (the pages poll its log).
    COMING_UP_STATES = ("starting", "loading")
    LIVE_STATES = (*COMING_UP_STATES, "ready")
    # What a restart takes: live ones, and those on a node that does not answer (their
    # replacement goes elsewhere).
    RESTARTABLE_STATES = (*LIVE_STATES, "unknown")
    # States that keep their cards: live ones, and those whose end is not confirmed.
    HOLDING_STATES = (*LIVE_STATES, "stopping", "unknown")
    # Ended: the engine is gone, by a stop or by a failure.
    ENDED_STATES = ("failed", "stopped")

    name = models.CharField(max_length=128, unique=True, validators=[name_validator])
    profile = models.ForeignKey(Profile, on_delete=models.PROTECT, related_name="replicas")
    port = models.PositiveIntegerField()
    state = models.CharField(max_length=16, choices=State.choices, default=State.STARTING)
    revision = models.PositiveIntegerField(help_text="The profile revision this replica runs.")
    engine_version = models.CharField(
        max_length=64,
        blank=True,
        default="",
        help_text="The engine release it was started with, as its node's agent reported it installed; "
        "empty: not known.",
    )
    # What each card was planned to hold when the replica started (the API's
    # memory answer), and what the engine and the card reported (bytes per
    # card, from its start-up log and nvidia-smi; see agent/llmgw_agent/memory_lines.py).
    planned_memory = models.JSONField(default=dict, blank=True)
    measured_memory = models.JSONField(default=dict, blank=True)
    measured_at = models.DateTimeField(null=True, blank=True)
    # A replica across nodes: rank 0's rendezvous port on its node (the engine's --master-port or
    # --dist-init-addr port), reserved on that host as the serving port is. Empty on one node.
    rendezvous_port = models.PositiveIntegerField(
        null=True, blank=True, help_text="Rank 0's rendezvous port, for a replica across nodes."
    )
    reason = models.TextField(
        blank=True, default="", help_text="What was last said of its state (the agent's reason, exit code)."
    )
    # When its state last changed: the reconciler acts only on what an agent said after this
    # (operations/services/reconcile.py), so a listing older than a change is not applied to it.
    state_changed_at = models.DateTimeField(
        default=timezone.now, help_text="When its state last changed (set with the state)."
    )

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(condition=Q(port__gte=1) & Q(port__lte=65535), name="replica_port_range"),
            models.CheckConstraint(
                condition=Q(rendezvous_port__isnull=True)
                | (Q(rendezvous_port__gte=1) & Q(rendezvous_port__lte=65535)),
                name="replica_rendezvous_port_range",
            ),
            models.CheckConstraint(condition=Q(revision__gte=1), name="replica_revision_positive"),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def is_live(self) -> bool:
        return self.state in self.LIVE_STATES

    @property
    def is_restartable(self) -> bool:
        """A restart may take it: live, or unknown (``restartable_replicas_q`` in a query)."""
        return self.state in self.RESTARTABLE_STATES

    @property
    def is_stale(self) -> bool:
        """It runs an older revision than its profile's (``stale_replicas_q`` in a query)."""
        return self.revision < self.profile.revision

    @property
    def placement(self) -> list[tuple[str, list[int]]]:
        """Each node it holds cards on, with their indices (prefetch ``shards__card__node``)."""
        nodes: dict[str, list[int]] = {}
        for shard in self.shards.all():
            nodes.setdefault(shard.card.node.name, []).append(shard.card.index)
        return list(nodes.items())


class Shard(models.Model):
    """One card a replica holds. A card is held by at most one replica."""

    replica = models.ForeignKey(Replica, on_delete=models.CASCADE, related_name="shards")
    card = models.OneToOneField(Card, on_delete=models.PROTECT, related_name="shard")
    # Which of the replica's ranks (one engine process, one per node unless an engine runs more)
    # holds this card: 0 on a replica that fits one node; rank 0 serves.
    rank = models.PositiveSmallIntegerField(
        default=0, db_default=0, help_text="The rank of the replica's group that holds it."
    )

    class Meta:
        ordering = ["card__node__name", "card__index"]

    def __str__(self) -> str:
        return f"{self.replica.name} on {self.card}"


def live_replicas_q(through: str = "") -> Q:
    """Replicas that run or are coming up (``Replica.is_live``); ``through`` is
    the path to them from another model, e.g. ``"profiles__replicas__"``."""
    return Q(**{f"{through}state__in": Replica.LIVE_STATES})


def restartable_replicas_q(through: str = "") -> Q:
    """Replicas a restart may take (``Replica.is_restartable``): live, or on a node that does not answer."""
    return Q(**{f"{through}state__in": Replica.RESTARTABLE_STATES})


def stale_replicas_q(through: str = "") -> Q:
    """Replicas running an older revision than their profile's (``Replica.is_stale``)."""
    return Q(**{f"{through}revision__lt": F(f"{through}profile__revision")})
