"""What a step works with: the run's records, its conversation with the agents, and how it tells
the scheduler that its slot is free (its replacement is ready)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from operations.models import RestartStep
from operations.services.runner.conversation import AgentConversation
from operations.services.runner.records import Records
from operations.services.runner.together import Together


@dataclass(frozen=True)
class RunParts:
    records: Records
    agents: AgentConversation
    # The step's replacement is ready: the run may start the next step while this one stops its
    # old replica (whose cards the run still counts as held until this step ends).
    slot_free: Callable[[RestartStep], None]
    # The run's rolling placements asked while another is being made, made together
    # (``placing.py``): one queue for all of the run's step threads.
    placing: Together[Any, bool] = field(default_factory=Together)
