from __future__ import annotations

from catalog.models.audit import AuditEntry
from catalog.models.fleet import Card, GPUClass, Node
from catalog.models.operations import RestartOperation, RestartStep
from catalog.models.serving import Profile, Replica, ServedModel, Shard

__all__ = [
    "AuditEntry",
    "Card",
    "GPUClass",
    "Node",
    "Profile",
    "Replica",
    "RestartOperation",
    "RestartStep",
    "ServedModel",
    "Shard",
]
