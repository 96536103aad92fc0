"""What a step works with: the run's records, its conversation with the agents, and how it tells
the scheduler that its slot is free (its replacement is ready)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from operations.models import RestartStep
from operations.services.runner.conversation import AgentConversation
from operations.services.runner.records import Records


@dataclass(frozen=True)
class RunParts:
    records: Records
    agents: AgentConversation
    # The step's replacement is ready: the run may start the next step while this one stops its
    # old replica (whose cards the run still counts as held until this step ends).
    slot_free: Callable[[RestartStep], None]
