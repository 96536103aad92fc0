from __future__ import annotations

from catalog.models.fleet import Card, GPUClass, Node
from catalog.models.serving import (
    EngineDefault,
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
    "EngineDefault",
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
