"""The pure planning core: the engine registry, the resize and context rules,
the card-memory model and the room check, over plain frozen dataclasses.

Nothing here touches the ORM or a request; services build the specs from the
catalog and turn the answers (or the ``DomainError`` refusals) into saves,
audit entries and restarts.
"""

from __future__ import annotations

from planning.args import drop_arg, get_arg, get_int_arg, set_arg
from planning.engines import (
    Engine,
    RegistryError,
    engine,
    launch_args,
    load_registry,
    refused,
    registry,
    terms_for,
)
from planning.memory import card_memory, kv_cache_bytes, kv_per_card
from planning.plan import plan_context, plan_resize
from planning.room import room_for
from planning.rules import (
    MAX_CARDS,
    card_count,
    card_counts_that_split,
    context_of,
    pick_profile,
    respread,
    splits_heads,
)
from planning.types import (
    CardMemory,
    Change,
    GPUClassSpec,
    ModelSpec,
    NodeRoom,
    ProfileSpec,
    Room,
    Shape,
)
from planning.units import GIB

__all__ = [
    "GIB",
    "MAX_CARDS",
    "CardMemory",
    "Change",
    "Engine",
    "GPUClassSpec",
    "ModelSpec",
    "NodeRoom",
    "ProfileSpec",
    "RegistryError",
    "Room",
    "Shape",
    "card_count",
    "card_counts_that_split",
    "card_memory",
    "context_of",
    "drop_arg",
    "engine",
    "get_arg",
    "get_int_arg",
    "kv_cache_bytes",
    "kv_per_card",
    "launch_args",
    "load_registry",
    "pick_profile",
    "plan_context",
    "plan_resize",
    "refused",
    "registry",
    "respread",
    "room_for",
    "set_arg",
    "splits_heads",
    "terms_for",
]
