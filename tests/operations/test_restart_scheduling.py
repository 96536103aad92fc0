"""The scheduler starts a wave of steps from one question, not one a step: the same steps, in the
same order, as asking step by step gives, in two queries whatever the wave's size.

No agent is needed: the steps are chosen, not run.
"""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from catalog.models import Profile
from operations.models import RestartOperation
from operations.services.runner.scheduling import Scheduler
from operations.services.start import restart_start
from operations.services.timing import RunClock
from tests.support import builders as b

pytestmark = pytest.mark.django_db


def _scheduler(op: RestartOperation) -> Scheduler:
    """A run's scheduler as ``schedule`` sets it up (no lease: nothing here waits on it)."""
    scheduler = Scheduler(op, lease=None, clock=RunClock(op.pk, op.max_parallel), threaded=True)  # type: ignore[arg-type]
    scheduler.read_steps()
    return scheduler


def _one_by_one(scheduler: Scheduler, free: int) -> list[int]:
    """What the scheduler started before: ``_next`` once a slot, each step taken before the next ask."""
    chosen = []
    for _ in range(free):
        if not scheduler.queue:
            break
        step_id = scheduler._next()
        if step_id is None:
            break
        scheduler._take(step_id)
        scheduler.under_way.add(step_id)
        chosen.append(step_id)
    return chosen


@pytest.mark.parametrize("cards", [8, 16])
def test_a_wave_is_chosen_as_one_by_one_in_two_queries(actor, cards):
    gpu = b.node("gpu-1", cards=cards)
    profile = b.profile(b.llama_8b("llama"), "h100")
    for i in range(6):
        b.replica(profile, gpu, [i], name=f"llama-{i + 1}")
    Profile.objects.filter(pk=profile.pk).update(revision=2)

    op = restart_start(model_name="llama", max_parallel=4)
    at_once = _scheduler(op)
    with CaptureQueriesContext(connection) as seen:
        wave = at_once._startable(6)
    # The cancel flag and the cards the old replicas hold; each step's plan was read with the steps.
    assert len(seen.captured_queries) == 2
    assert wave == _one_by_one(_scheduler(op), 6)
    planned = {s.pk: s.planned_cards for s in op.steps.all()}
    if cards == 8:
        # Two cards free: the plan puts the last two steps on the cards the first two's old
        # replicas hold, so they wait for those to end.
        assert len(wave) == 4 and all(planned[pk][0] not in (0, 1) for pk in wave)
    else:
        assert len(wave) == 6
