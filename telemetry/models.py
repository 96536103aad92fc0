"""What the agents report of their cards: the latest reading per card, a short history, and when
each node's agent last answered. Observations, not changes: nothing here is audited."""

from __future__ import annotations

from django.db import models

from catalog.models import Card, Node


class NodeReading(models.Model):
    """When the node's agent last answered a telemetry request, or why it did not."""

    node = models.OneToOneField(Node, on_delete=models.CASCADE, primary_key=True, related_name="reading")
    seen_at = models.DateTimeField(null=True, blank=True, help_text="Its agent's last answer.")
    asked_at = models.DateTimeField(help_text="The last time it was asked.")
    error = models.TextField(blank=True, default="", help_text="Why the last request failed; empty if not.")
    source = models.CharField(max_length=32, blank=True, default="", help_text="nvidia-smi, or config.")

    def __str__(self) -> str:
        return f"{self.node_id}: seen {self.seen_at}"


class CardReading(models.Model):
    """The latest reading of one card. ``processes``: each holding memory on it, as the agent
    reported it, with ``foreign`` set when the catalog knows no live replica of it on this card."""

    card = models.OneToOneField(Card, on_delete=models.CASCADE, primary_key=True, related_name="reading")
    at = models.DateTimeField()
    memory_used_mib = models.PositiveIntegerField(null=True, blank=True)
    memory_total_mib = models.PositiveIntegerField(null=True, blank=True)
    utilization_percent = models.PositiveSmallIntegerField(null=True, blank=True)
    temperature_c = models.SmallIntegerField(null=True, blank=True)
    processes = models.JSONField(default=list, blank=True)
    foreign_mib = models.PositiveIntegerField(
        default=0, help_text="Memory held by processes the catalog does not know."
    )

    class Meta:
        # Every dry run asks which cards a foreign process holds (kept answers are keyed on them):
        # those few readings, not a scan of one a card.
        indexes = [
            models.Index(fields=["at"], condition=models.Q(foreign_mib__gt=0), name="card_reading_foreign")
        ]

    def __str__(self) -> str:
        return f"card {self.card_id} at {self.at}"


class CardSample(models.Model):
    """One reading of a card, kept for LLMGW_TELEMETRY_HISTORY_SECONDS (at most
    LLMGW_TELEMETRY_HISTORY_SAMPLES of a card)."""

    card = models.ForeignKey(Card, on_delete=models.CASCADE, related_name="samples")
    at = models.DateTimeField()
    memory_used_mib = models.PositiveIntegerField(null=True, blank=True)
    utilization_percent = models.PositiveSmallIntegerField(null=True, blank=True)
    temperature_c = models.SmallIntegerField(null=True, blank=True)
    foreign_mib = models.PositiveIntegerField(default=0)

    class Meta:
        # By card for a card's history; by age for the round's prune (one DELETE by range).
        indexes = [
            models.Index(fields=["card", "at"], name="card_sample_card_at"),
            models.Index(fields=["at"], name="card_sample_at"),
        ]

    def __str__(self) -> str:
        return f"card {self.card_id} at {self.at}"
