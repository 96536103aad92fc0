"""The pages in a real headless Chromium (Debian's, driven by Playwright) against a live server: the
forms. The live preview answers without a page reload, apply saves and audits and shows the restart
live, a viewer gets no form, the filters and the keyboard work, and the browser logs no error."""

from __future__ import annotations

import re

import pytest

from audit.models import AuditEntry
from catalog.models import Profile
from operations.models import RestartOperation
from tests.browser.browser_support import MARKER, PASSWORD, operator, sign_in, watch_it_run
from tests.support import builders as b

pytestmark = [
    pytest.mark.browser,
    pytest.mark.deployed_hasher,  # an operator signs in through the form
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("audit_flushable"),
]


def test_a_card_count_that_does_not_fit_says_so_without_a_page_reload(page, demo):
    operator()
    sign_in(page, "operator")
    page.goto("/models/llama-3.1-70b/")
    page.evaluate(f"{MARKER} = 'still here'")
    page.get_by_label("Cards per replica").fill("2")
    refusal = page.locator("#resize-preview .refusal")
    refusal.wait_for()
    text = refusal.inner_text()
    assert "On 2 h100-80g cards each would hold" in text
    assert "more than the 71.7 GiB usable on each" in text
    assert "Two ways out: more cards (4 cards would hold it)" in text
    assert page.locator("#resize-preview .membar.over").is_visible()
    assert page.evaluate(MARKER) == "still here"  # no reload: the fragment was swapped in
    assert page.get_by_role("button", name=re.compile("^Apply")).count() == 0
    assert Profile.objects.get(model__name="llama-3.1-70b").revision == 1


def test_a_count_that_fits_previews_then_apply_saves_audits_and_shows_the_restart_live(page, demo, shots):
    operator()
    sign_in(page, "operator")
    page.goto("/models/llama-3.1-8b/")
    page.screenshot(path=shots / "model-page.png", full_page=True)
    page.evaluate(f"{MARKER} = 'still here'")

    page.get_by_label("Cards per replica").fill("2")
    preview = page.locator("#resize-preview .preview.ok")
    preview.wait_for()
    assert "h100: 1 → 2 cards of h100-80g" in preview.inner_text()
    assert "Room beside the running replicas on gpu-h1, gpu-h2" in preview.inner_text()
    assert page.evaluate(MARKER) == "still here"
    page.locator("#resize-preview").scroll_into_view_if_needed()
    page.screenshot(path=shots / "resize-preview.png", full_page=True)

    page.get_by_role("button", name="Apply: 2 cards").click()
    page.locator(".message.success").wait_for()
    assert (
        "llama-3.1-8b/h100: 1 → 2 cards, saved as revision 2."
        in page.locator(".message.success").inner_text()
    )
    assert page.evaluate(MARKER) == "still here"  # HX-Location: swapped in, not reloaded
    profile = Profile.objects.get(model__name="llama-3.1-8b")
    assert (profile.revision, profile.tp) == (2, 2)
    entry = AuditEntry.objects.get(action="resize")
    assert (entry.via, entry.actor) == ("ui", "operator")

    # The restart the resize started shows on the same page, live.
    op = RestartOperation.objects.get(model__name="llama-3.1-8b")
    assert sorted(op.steps.values_list("old_replica__name", flat=True)) == [
        "llama-3.1-8b-1",
        "llama-3.1-8b-2",
    ]
    watch_it_run(page, op)


def test_a_restart_shows_live_and_stops_polling_when_it_ends(page, demo):
    operator()
    Profile.objects.filter(model__name="mistral-7b").update(revision=2)  # its replica is now stale
    sign_in(page, "operator")
    page.goto("/models/mistral-7b/")
    page.evaluate(f"{MARKER} = 'still here'")
    page.get_by_role("button", name="Restart 1 stale replica on mistral-7b's current profile").click()
    page.locator(".message.success").wait_for()
    op = RestartOperation.objects.get(model__name="mistral-7b")
    assert (op.via, op.requested_by_name) == ("ui", "operator")
    watch_it_run(page, op)
    assert page.evaluate(MARKER) == "still here"


def test_an_operator_cancels_a_queued_restart_from_its_page(page, demo):
    operator()
    Profile.objects.filter(model__name="mistral-7b").update(revision=2)
    sign_in(page, "operator")
    page.goto("/models/mistral-7b/")
    page.get_by_role("button", name=re.compile("^Restart 1 stale replica")).click()
    page.locator(".message.success").wait_for()
    op = RestartOperation.objects.get(model__name="mistral-7b")
    page.goto(f"/operations/{op.pk}/")
    page.get_by_role("button", name=f"Cancel restart #{op.pk}").click()
    page.locator(f"#operation-{op.pk}:not([hx-trigger]) .badge.state-cancelled").first.wait_for()
    assert page.get_by_role("button", name=re.compile("^Cancel")).count() == 0  # removed out of band
    assert RestartOperation.objects.get(pk=op.pk).state == "cancelled"
    assert AuditEntry.objects.filter(action="restart_cancel", via="ui").count() == 1


def test_the_context_form_previews_too(page, demo):
    operator()
    sign_in(page, "operator")
    page.goto("/models/llama-3.1-8b/")
    page.get_by_label("Context (tokens)").fill("131072")
    preview = page.locator("#context-preview .preview.ok")
    preview.wait_for()
    assert "32768 → 131072 tokens" in preview.inner_text()
    assert "KV cache 16.0 GiB (131072 tokens)" in preview.inner_text()


def test_a_viewer_sees_the_pages_without_any_form(page, demo, shots):
    b.user("viewer", password=PASSWORD)
    sign_in(page, "viewer")
    page.goto("/models/llama-3.1-8b/")
    assert page.locator("form[hx-post]").count() == 0
    assert page.get_by_label("Cards per replica").count() == 0
    assert page.get_by_role("button", name=re.compile("Apply|Restart|Cancel")).count() == 0
    assert "Read-only" in page.locator("main").inner_text()
    page.goto("/nodes/")
    # 13 held by the one-node replicas, 16 by the 405B's two ranks (gpu-h3 and gpu-h4, all eight each).
    assert page.locator(".card.held").count() == 29 and page.locator(".card.free").count() == 19
    page.screenshot(path=shots / "nodes.png", full_page=True)


def test_swagger_ui_loads_the_schema_under_the_content_security_policy(page, demo):
    b.user("viewer", password=PASSWORD)
    sign_in(page, "viewer")
    page.goto("/api/docs/")
    page.locator(".swagger-ui .info .title").wait_for()
    assert "llmgw-web API" in page.locator(".swagger-ui .info .title").inner_text()
    page.locator(".opblock-tag").first.wait_for()


def test_the_models_filters_narrow_the_list_in_place(page, demo):
    b.user("viewer", password=PASSWORD)
    sign_in(page, "viewer")
    page.evaluate(f"{MARKER} = 'still here'")
    page.get_by_label("Engine").select_option("llamacpp")
    page.wait_for_url(re.compile(r"engine=llamacpp"))
    page.locator("#model-results .count", has_text="2 models match").wait_for()
    assert page.evaluate(MARKER) == "still here"


def test_the_pages_work_from_the_keyboard(page, demo):
    operator()
    sign_in(page, "operator")
    page.goto("/models/llama-3.1-8b/")
    page.get_by_label("Cards per replica").focus()
    page.keyboard.press("ArrowUp")  # 1 → 2, as a keyboard user would
    page.locator("#resize-preview .preview.ok").wait_for()
    page.keyboard.press("Tab")  # the nodes field (empty: as few as hold the cards)
    page.keyboard.press("Tab")  # the in-place checkbox
    page.keyboard.press("Tab")  # the Apply button in the preview
    assert page.evaluate("document.activeElement.textContent.trim()") == "Apply: 2 cards"
    page.keyboard.press("Enter")
    page.locator(".message.success").wait_for()
    assert Profile.objects.get(model__name="llama-3.1-8b").revision == 2
