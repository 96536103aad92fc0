"""A refused request is one line in the log: no traceback, not twice, with debug on."""

from __future__ import annotations

import io
import logging

import pytest
from django.contrib.auth import get_user_model
from django.test import Client, override_settings

from tests.support import builders as b

pytestmark = pytest.mark.django_db


def _every_handler() -> list[logging.Handler]:
    names = ["", *logging.root.manager.loggerDict]
    seen: list[logging.Handler] = []
    for name in names:
        logger = logging.getLogger(name) if name else logging.root
        for handler in getattr(logger, "handlers", []):
            if handler not in seen:
                seen.append(handler)
    return seen


def test_a_refused_page_request_writes_one_line_without_a_traceback():
    b.profile(b.llama_8b())
    b.user("viewer", password="pw-for-tests-only-123")
    client = Client()
    client.force_login(get_user_model().objects.get(username="viewer"))
    # Every stream handler the logging config set up writes into one buffer, as to a terminal.
    out = io.StringIO()
    # (pytest's own capturing handlers are subclasses: left alone.)
    streams = [h for h in _every_handler() if type(h) is logging.StreamHandler]
    before = [h.setStream(out) for h in streams]
    try:
        with override_settings(DEBUG=True):
            response = client.post("/models/llama-3.1-8b/resize/", {"gpus": "2"})
    finally:
        for handler, stream in zip(streams, before, strict=True):
            handler.setStream(stream)
    assert response.status_code == 403
    lines = [line for line in out.getvalue().splitlines() if line.strip()]
    assert lines == ["Forbidden (Permission denied): /models/llama-3.1-8b/resize/"]
