"""The fleets and the spy the kept rows' tests share (test_kept_rows.py, test_kept_api_rows.py)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from operations.models import RestartOperation, RestartStep
from tests.support import builders as b


def spy(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str) -> Counter[str]:
    """``owner.name`` still runs, each call counted."""
    calls: Counter[str] = Counter()
    real: Callable[..., Any] = getattr(owner, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls["all"] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)
    return calls


@pytest.fixture
def two() -> dict:
    """The fleet of test_kept_answers.py (a model, its profile, llama-1 on gpu-0) and a second model,
    its profile and a replica on another node."""
    cls = b.gpu_class()
    nodes = [b.node(f"gpu-{i}", cls=cls, cards=4) for i in range(3)]
    model = b.llama_8b("llama")
    profile = b.profile(model, "one")
    replica = b.replica(profile, nodes[0], [0], name="llama-1")
    other = b.llama_8b("other")
    b.replica(b.profile(other, "one"), nodes[1], [0, 1], name="other-1")
    return {"nodes": nodes, "model": model, "profile": profile, "replica": replica}


@pytest.fixture
def ended(two) -> dict:
    """Two ended restarts, the first with a step that replaced llama-1."""
    first = RestartOperation.objects.create(
        model=two["model"], profile=two["profile"], state="succeeded", reason="first"
    )
    RestartStep.objects.create(operation=first, old_replica=two["replica"], state="succeeded")
    RestartOperation.objects.create(
        model=two["model"], profile=two["profile"], state="failed", reason="second"
    )
    return two
