"""Resizes racing on PostgreSQL: real threads, each with its own connection, released together.

The model's row is locked NOWAIT while a change is planned and saved: one change applies, the others
are refused ``busy`` (the lock was held) or ``unchanged`` (they planned after it committed), and no
change is planned from a profile another one has already replaced.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.db import connection, transaction
from rest_framework.test import APIClient

from audit.models import AuditEntry
from audit.services import verify_chain
from base.actor import Actor
from base.errors import DomainError
from catalog.models import Profile, ServedModel
from operations.services.resize import model_resize, model_set_context
from tests.support import builders as b

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

THREADS = 20
SERVING = ("gpus_per_node", "tp", "nodes", "pp", "args", "env", "revision")


def race(count: int, work: Callable[[int], Any]) -> list[Any]:
    """``work(i)`` in ``count`` threads released at once; each answer, or the exception it raised."""
    barrier = threading.Barrier(count)
    answers: list[Any] = [None] * count

    def run(i: int) -> None:
        try:
            barrier.wait(timeout=30)
            answers[i] = work(i)
        except BaseException as exc:  # kept, so that the test can say which thread failed and how
            answers[i] = exc
        finally:
            connection.close()  # this thread's own connection

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a thread did not finish"
    return answers


def outcome(answer: Any) -> str:
    """ "applied", or the refusal's code; any other exception fails the test."""
    if isinstance(answer, DomainError):
        return answer.code
    if isinstance(answer, BaseException):
        raise AssertionError(f"a thread failed with {answer!r}") from answer
    return "applied"


def resize_as(i: int, gpus: int) -> Any:
    return model_resize(name="llama-3.1-8b", gpus=gpus, actor=Actor(via="cli", name=f"thread-{i}"))


def llama(cards: int = 8) -> Profile:
    b.node("gpu-1", cards=cards)
    return b.profile(b.llama_8b(), "h100", gpus=1, args=["--max-model-len", "32768"])


def serving(p: Profile) -> dict[str, Any]:
    p.refresh_from_db()
    return {f: getattr(p, f) for f in SERVING}


def assert_no_lost_update(p: Profile, applied: int) -> list[AuditEntry]:
    """Each applied change was planned from the one before it, and the profile is the last one's after."""
    entries = list(AuditEntry.objects.filter(object_type="profile").order_by("id"))
    assert len(entries) == applied
    for earlier, later in zip(entries, entries[1:], strict=False):
        assert later.before is not None and earlier.after is not None
        assert {f: later.before[f] for f in SERVING} == {f: earlier.after[f] for f in SERVING}
    last = entries[-1].after
    assert last is not None
    assert serving(p) == {f: last[f] for f in SERVING}
    assert serving(p)["revision"] == 1 + applied
    assert verify_chain() == []
    return entries


def test_twenty_identical_resizes_through_the_service_apply_exactly_once():
    p = llama()

    answers = race(THREADS, lambda i: resize_as(i, 4))

    outcomes = [outcome(a) for a in answers]
    assert outcomes.count("applied") == 1, outcomes
    assert set(outcomes) - {"applied"} <= {"busy", "unchanged"}, outcomes
    (entry,) = assert_no_lost_update(p, applied=1)
    assert entry.action == "resize" and (entry.before["tp"], entry.after["tp"]) == (1, 4)
    current = serving(p)
    assert current["tp"] == current["gpus_per_node"] == 4 and current["revision"] == 2
    winner = next(a for a in answers if outcome(a) == "applied")
    assert entry.actor == f"thread-{answers.index(winner)}"


def test_twenty_identical_resizes_through_the_api_apply_exactly_once():
    p = llama()
    alice = get_user_model().objects.create_user("alice", password=None)
    alice.user_permissions.add(Permission.objects.get(codename="resize_model"))

    def post(i: int):
        c = APIClient()
        c.force_authenticate(alice)
        return c.post("/api/models/llama-3.1-8b/gpus/", {"gpus": 4}, format="json")

    responses = race(THREADS, post)

    statuses = sorted((r.status_code, r.json().get("code")) for r in responses)
    assert statuses.count((200, None)) == 1, statuses
    assert {s for s in statuses if s[0] != 200} <= {(409, "busy"), (400, "unchanged")}, statuses
    for r in responses:
        if r.status_code == 409:
            assert "Another change to llama-3.1-8b is being saved" in r.json()["detail"]
    (entry,) = assert_no_lost_update(p, applied=1)
    assert (entry.via, entry.user, entry.action) == ("api", alice, "resize")
    assert serving(p)["tp"] == 4


def test_two_sizes_racing_lose_no_update():
    p = llama()

    answers = race(THREADS, lambda i: resize_as(i, 2 if i % 2 else 4))

    outcomes = [outcome(a) for a in answers]
    applied = [a for a in answers if outcome(a) == "applied"]
    assert 1 <= len(applied) <= 2 and set(outcomes) - {"applied"} <= {"busy", "unchanged"}, outcomes
    entries = assert_no_lost_update(p, applied=len(applied))
    assert serving(p)["tp"] == entries[-1].after["tp"] in (2, 4)
    # Whatever order they landed in, each entry says the size its change asked for.
    assert sorted(e.after["tp"] for e in entries) == sorted(c.after for c in applied)


def test_a_resize_and_a_context_change_racing_keep_both_or_refuse_one():
    p = llama()

    def work(i: int):
        actor = Actor(via="cli", name=f"thread-{i}")
        if i % 2:
            return model_set_context(name="llama-3.1-8b", tokens=8192, actor=actor)
        return model_resize(name="llama-3.1-8b", gpus=2, actor=actor)

    answers = race(THREADS, work)

    applied = [a for a in answers if outcome(a) == "applied"]
    entries = assert_no_lost_update(p, applied=len(applied))
    final = serving(p)
    if {e.action for e in entries} == {"resize", "set_context"}:
        assert (final["tp"], final["args"]) == (2, ["--max-model-len", "8192"])


def test_a_change_while_another_holds_the_model_is_refused_busy_and_a_preview_still_answers():
    p = llama()
    alice = get_user_model().objects.create_user("alice", password=None)
    alice.user_permissions.add(Permission.objects.get(codename="resize_model"))
    held, release = threading.Event(), threading.Event()

    def hold_the_model() -> None:
        try:
            with transaction.atomic():
                ServedModel.objects.select_for_update().get(name="llama-3.1-8b")
                held.set()
                release.wait(timeout=30)
        finally:
            connection.close()

    holder = threading.Thread(target=hold_the_model)
    holder.start()
    try:
        assert held.wait(timeout=10)
        c = APIClient()
        c.force_authenticate(alice)
        busy = c.post("/api/models/llama-3.1-8b/gpus/", {"gpus": 2}, format="json")
        preview = c.post("/api/models/llama-3.1-8b/gpus/", {"gpus": 2, "dry_run": True}, format="json")
    finally:
        release.set()
        holder.join(timeout=30)

    assert busy.status_code == 409
    assert busy.json() == {
        "detail": "Another change to llama-3.1-8b is being saved right now: look at it, then try again.",
        "code": "busy",
    }
    assert preview.status_code == 200 and preview.json()["after"] == 2
    assert serving(p)["tp"] == 1 and AuditEntry.objects.count() == 0

    again = c.post("/api/models/llama-3.1-8b/gpus/", {"gpus": 2}, format="json")
    assert again.status_code == 200 and serving(p)["tp"] == 2
