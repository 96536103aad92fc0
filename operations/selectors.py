"""Reads of restart operations that need care."""

from __future__ import annotations

from django.db.models import Prefetch, QuerySet

from operations.models import RestartOperation, RestartStep


def operations_with_steps() -> QuerySet[RestartOperation]:
    """Operations with their model, profile and steps, each step with its two
    replicas, in two queries however many steps there are."""
    steps = RestartStep.objects.select_related("old_replica", "new_replica").order_by("id")
    return RestartOperation.objects.select_related("model", "profile").prefetch_related(
        Prefetch("steps", queryset=steps)
    )
