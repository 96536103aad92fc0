"""What the browser tests share: Chromium under Playwright, a signed-in page that fails on any
browser error or policy violation, screenshots, the demo fleet, and the helpers their steps use.

Screenshots are taken at a laptop's width (1366 px); they are written to ``$SCREENSHOTS_DIR`` when
it is set (``make screenshots`` sets it to docs/screenshots), else to the test's temporary directory.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

from base.actor import Actor, acting_as
from catalog.models import Card, Replica, Shard
from operations.models import RestartOperation, RestartStep
from tests.support import builders as b

# Playwright's sync API runs an event loop in this thread; the ORM calls the
# tests make between page actions are plain synchronous ones.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")


CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
LAPTOP = {"width": 1366, "height": 900}
PASSWORD = "pw-for-tests-only-123"
MARKER = "window.__llmgwMarker"


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"{CHROMIUM} is missing: run `make browser-deps` (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser, live_server) -> Iterator[object]:
    """A fresh page at laptop width; fails the test on any console error, uncaught exception or
    Content Security Policy violation, and on any page of the site served without the policy."""
    context = browser.new_context(viewport=LAPTOP, base_url=live_server.url)
    # Playwright's init scripts are not subject to the page's policy: this one reports each violation.
    context.add_init_script(
        "document.addEventListener('securitypolicyviolation', e => console.error("
        "'CSP violation: ' + e.violatedDirective + ' blocked ' + (e.blockedURI || 'inline')))"
    )
    page = context.new_page()
    page.set_default_timeout(10_000)
    errors: list[str] = []
    page.on("console", lambda m: errors.append(f"console: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda exc: errors.append(f"pageerror: {exc}"))

    def policed(response: Any) -> None:
        ours = response.request.resource_type == "document" and response.url.startswith(live_server.url)
        if ours and "script-src 'self'" not in (response.headers.get("content-security-policy") or ""):
            errors.append(f"no Content-Security-Policy on {response.url}")

    page.on("response", policed)
    yield page
    context.close()
    assert errors == [], errors


@pytest.fixture
def shots(tmp_path) -> Path:
    where = Path(os.environ.get("SCREENSHOTS_DIR") or tmp_path)
    where.mkdir(parents=True, exist_ok=True)
    return where


@pytest.fixture
def demo(transactional_db) -> None:
    """The demo fleet, plus a 70B model on four h100 cards that fits on no fewer than four."""
    call_command("seed_demo")
    with acting_as(Actor(via="cli", name="pytest")):
        big = b.llama_8b(
            "llama-3.1-70b",
            source="meta-llama/Llama-3.1-70B-Instruct",
            layers=80,
            attention_heads=64,
            kv_bytes_per_token=2 * 80 * 8 * 128 * 2,
            weight_bytes=141_107_412_992,
        )
        profile = b.profile(big, "h100", gpus=4, args=["--max-model-len", "32768"])
        replica = Replica.objects.create(
            name="llama-3.1-70b-1", profile=profile, port=8010, state="ready", revision=profile.revision
        )
        for card in Card.objects.filter(node__name="gpu-h2", index__in=[4, 5, 6, 7]):
            Shard.objects.create(replica=replica, card=card)


def sign_in(page, username: str) -> None:
    page.goto("/accounts/login/")
    page.get_by_label("User name").fill(username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(re.compile(r"/$"))


def operator() -> None:
    b.user(
        "operator",
        "catalog.resize_model",
        "catalog.restart_model",
        "catalog.view_servedmodel",
        password=PASSWORD,
    )


def watch_it_run(page, op: RestartOperation) -> None:
    """The panel polls while the restart runs, shows each step's state as the worker records it, and
    stops polling once the operation has ended."""
    panel = page.locator(f"#operation-{op.pk}")
    panel.wait_for()
    assert panel.get_attribute("hx-trigger") == "every 1s"
    RestartOperation.objects.filter(pk=op.pk).update(state="running")
    RestartStep.objects.filter(operation=op).update(state="waiting", node="gpu-h1", cards=[3, 4])
    page.locator(f"#operation-{op.pk} .badge.state-waiting").first.wait_for()
    RestartStep.objects.filter(operation=op).update(state="succeeded")
    RestartOperation.objects.filter(pk=op.pk).update(state="succeeded", reason="Every replica restarted.")
    page.locator(f"#operation-{op.pk}:not([hx-trigger])").wait_for()
    assert "Every replica restarted." in panel.inner_text()
    steps = op.steps.count()
    assert f"{steps} of {steps} step{'s' if steps != 1 else ''} done" in panel.inner_text()
