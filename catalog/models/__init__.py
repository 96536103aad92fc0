from __future__ import annotations

from catalog.models.fleet import Card, GPUClass, Node
from catalog.models.serving import (
    Profile,
    Replica,
    ServedModel,
    Shard,
    live_replicas_q,
    restartable_replicas_q,
    stale_replicas_q,
)

__all__ = [
    "Card",
    "GPUClass",
    "Node",
    "Profile",
    "Replica",
    "ServedModel",
    "Shard",
    "live_replicas_q",
    "restartable_replicas_q",
    "stale_replicas_q",
]
