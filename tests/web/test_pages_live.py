"""The parts of the pages that poll themselves: the nodes grid's summary and results, a node's page
below its actions, the operations list while a restart is active. A poll of a part that has not
changed is a 204 (htmx swaps nothing) after one query; a change is swapped in."""

from __future__ import annotations

import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from catalog.models import Node
from tests.support import builders as b
from tests.web.pages_support import HX, operation, signed_in

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("audit_flushable")]


def stamp_in(html: str) -> str:
    found = re.search(r'hx-headers="\{&quot;X-Llmgw-Shown&quot;: &quot;([0-9a-f]+)&quot;\}"', html)
    assert found is not None, html[:300]
    return found.group(1)


def poll(client, url: str, target: str, stamp: str):
    return client.get(url, HTTP_HX_TARGET=target, HTTP_X_LLMGW_SHOWN=stamp, **HX)


@pytest.mark.parametrize(
    ("url", "target", "looked_up"),
    [("/nodes/", "node-results", 0), ("/nodes/", "fleet-summary", 0), ("/nodes/gpu-1/", "node-body", 1)],
)
def test_a_part_polls_and_an_unchanged_poll_is_answered_204_after_one_query(settings, url, target, looked_up):
    settings.LLMGW_PAGE_POLL_SECONDS = 3
    node = b.node("gpu-1")
    b.replica(b.profile(b.llama_8b("llama"), "h100"), node, [0], name="llama-1")
    viewer = signed_in(b.user("viewer"))
    page = viewer.get(url).content.decode()
    part = re.search(rf'<(div|section) [^>]*id="{target}"[^>]*>', page).group(0)
    assert 'hx-trigger="every 3s"' in part and 'hx-swap="outerHTML"' in part
    stamp = stamp_in(part)

    with CaptureQueriesContext(connection) as queries:
        same = poll(viewer, url, target, stamp)
    assert same.status_code == 204 and same.content == b""
    # the session, the user, the versions (its permissions kept under them; and the node, by its
    # name): nothing of the part itself
    assert len(queries) == 3 + looked_up

    Node.objects.filter(name="gpu-1").update(state="cordoned")  # a write every part shows
    changed = poll(viewer, url, target, stamp)
    assert changed.status_code == 200
    html = changed.content.decode()
    assert f'id="{target}"' in html and "<html" not in html
    assert stamp_in(html) != stamp


def test_a_node_whose_agent_is_not_answering_is_not_shown_ready_and_is_counted(settings):
    node = b.node("gpu-1")
    b.node("gpu-2")
    Node.objects.filter(pk=node.pk).update(reachable=False, unreachable_reason="connection refused")
    viewer = signed_in(b.user("viewer"))
    page = viewer.get("/nodes/").content.decode()
    summary = page.split('id="fleet-summary"')[1].split("</section>")[0]
    assert re.search(r'class="unreachable-count">.*not answering</span> 1 node<', summary)
    gpu_1 = page.split('id="node-' + str(node.pk) + '"')[1].split("</header>")[0]
    assert "Not answering" in gpu_1 and "state-ready" not in gpu_1
    head = viewer.get("/nodes/gpu-1/").content.decode().split('class="page-head"')[1].split("</div>")[0]
    assert "Not answering" in head and "Ready" not in head


def test_the_operations_list_polls_while_a_restart_is_active_and_stops_after(settings):
    settings.LLMGW_PAGE_POLL_SECONDS = 2
    model = b.llama_8b("llama")
    b.profile(model, "h100")
    op = operation(model, state="running")
    viewer = signed_in(b.user("viewer"))
    page = viewer.get("/operations/").content.decode()
    assert re.search(r'<div id="operation-rows" hx-get="/operations/" hx-trigger="every 2s"', page)
    type(op).objects.filter(pk=op.pk).update(state="succeeded")
    again = viewer.get("/operations/", HTTP_HX_TARGET="operation-rows", **HX).content.decode()
    assert again.lstrip().startswith('<div id="operation-rows">')  # no trigger: the polling stops
    assert "<html" not in again
