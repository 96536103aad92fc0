"""The restart operation pages: a running one polls itself, the model page and the list show it, an
operator cancels it (audited) and restarts stale replicas, a viewer cannot."""

from __future__ import annotations

import pytest

from audit.models import AuditEntry
from catalog.models import Profile
from operations.models import RestartOperation, RestartStep
from tests.web.pages_support import HX, llama_on_h100, operation

pytestmark = pytest.mark.django_db


# -- restart operations -----------------------------------------------------------------------------------


def test_a_running_operation_polls_itself_and_a_finished_one_does_not(viewer):
    m = llama_on_h100()
    op = operation(m)
    fragment = viewer.get(f"/operations/{op.pk}/", **HX).content.decode()
    assert "<html" not in fragment
    assert f'hx-get="/operations/{op.pk}/" hx-trigger="every 1s"' in fragment
    assert "llama-1" in fragment and "waiting" in fragment
    RestartOperation.objects.filter(pk=op.pk).update(state="succeeded", reason="All 1 replicas restarted.")
    RestartStep.objects.filter(operation=op).update(state="succeeded")
    done = viewer.get(f"/operations/{op.pk}/", **HX).content.decode()
    assert "hx-trigger" not in done and "1 of 1 step done" in done and "All 1 replicas restarted." in done
    whole = viewer.get(f"/operations/{op.pk}/").content.decode()
    assert whole.lstrip().startswith("<!doctype html>") and "Restart #" in whole


def test_the_model_page_shows_its_latest_restart_live(viewer):
    m = llama_on_h100()
    op = operation(m)
    page = viewer.get("/models/llama-3.1-8b/").content.decode()
    assert f'id="operation-{op.pk}"' in page and 'hx-trigger="every 1s"' in page


def test_the_operations_list_shows_state_and_steps(viewer):
    m = llama_on_h100()
    op = operation(m, state="partly_failed")
    RestartStep.objects.filter(operation=op).update(state="failed", reason="not ready within 600 s")
    page = viewer.get("/operations/").content.decode()
    assert f'href="/operations/{op.pk}/"' in page and "partly failed" in page and "1 failed" in page


def test_an_operator_can_cancel_a_running_restart_and_it_is_audited(operator):
    m = llama_on_h100()
    op = operation(m)
    page = operator.get(f"/operations/{op.pk}/").content.decode()
    assert f'hx-post="/operations/{op.pk}/cancel/"' in page
    response = operator.post(f"/operations/{op.pk}/cancel/", **HX)
    assert response.status_code == 200 and b"<html" not in response.content
    assert b"Cancel asked" in response.content and b'hx-swap-oob="true"' in response.content
    assert RestartOperation.objects.get().cancel_requested
    assert AuditEntry.objects.filter(action="restart_cancel", via="ui").count() == 1


def test_a_viewer_cannot_cancel(viewer):
    m = llama_on_h100()
    op = operation(m)
    assert "Cancel restart" not in viewer.get(f"/operations/{op.pk}/").content.decode()
    assert viewer.post(f"/operations/{op.pk}/cancel/").status_code == 403
    assert not RestartOperation.objects.get().cancel_requested


def test_an_operator_restarts_stale_replicas_from_the_model_page(operator):
    m = llama_on_h100()
    Profile.objects.filter(model=m).update(revision=2)
    page = operator.get("/models/llama-3.1-8b/").content.decode()
    assert "Restart 1 stale replica on llama-3.1-8b's current profile" in page
    response = operator.post("/models/llama-3.1-8b/restart/", **HX)
    assert response.status_code == 204 and response["HX-Location"] == "/models/llama-3.1-8b/#restart"
    op = RestartOperation.objects.get()
    assert (op.via, op.requested_by_name, op.steps.count()) == ("ui", "operator", 1)


# -- what a change says: once, in the message or on the page, not in both -----------------------------------


@pytest.mark.parametrize(
    ("post", "data", "landing", "said", "explained"),
    [
        (
            "/operations/{op}/cancel/",
            {},
            "/operations/{op}/",
            "Cancel of restart #{op} asked.",
            "steps under way finish",
        ),
        ("/nodes/gpu-1/cordon/", {}, "/nodes/gpu-1/", "gpu-1 cordoned.", "no new placements"),
        (
            "/nodes/gpu-1/cards/cordon/",
            {"index": 0},
            "/nodes/gpu-1/",
            "Card 0 of gpu-1 cordoned.",
            "takes no new replica",
        ),
    ],
)
def test_a_change_is_said_once_and_what_it_means_once(operator, post, data, landing, said, explained):
    """The success message says what was done, the page what it means: neither sentence twice (the cancel's
    message repeated the page's "steps under way finish, the others do not start")."""
    op = operation(llama_on_h100())
    response = operator.post(post.format(op=op.pk), data)
    assert response.status_code == 303
    page = operator.get(landing.format(op=op.pk)).content.decode()
    assert page.count(said.format(op=op.pk)) == 1
    assert page.count(explained) == 1
    assert page.count('class="message success"') == 1
