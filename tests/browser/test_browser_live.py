"""The pages that stay true without a reload, in a real Chromium against real agents: the nodes grid
and a node's page follow a drain to its end; a node whose agent stops answering is never shown
ready; a card a process the catalog does not know holds is counted held and names it."""

from __future__ import annotations

import os
import signal

import pytest

from base.actor import Actor, acting_as
from tests.browser.browser_support import MARKER, PASSWORD, operator, sign_in
from tests.support import builders as b

pytestmark = [
    pytest.mark.browser,
    pytest.mark.deployed_hasher,  # users sign in through the form
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("audit_flushable"),
]


def node_section(page, name: str):
    return page.locator("section.node", has=page.get_by_role("link", name=name, exact=True))


def test_the_nodes_grid_and_the_node_page_follow_a_drain_without_a_reload(page, tmp_path, fast_restarts):
    """Real agents: gpu-a is drained through the service and its restart run by the worker's code;
    the grid (in one tab) and gpu-a's page (in another), opened before, show its cards free and its
    replicas gone once it has ended, swapped in by their polls, never reloaded."""
    from operations.models import RestartOperation
    from operations.services.drain import node_drain
    from operations.services.runner import run_operation
    from tests.support.restart import fleet_of

    fast_restarts.LLMGW_PAGE_POLL_SECONDS = 1
    with fleet_of(tmp_path, nodes=("gpu-a", "gpu-b"), cards=4, processes=True) as fleet:
        fleet.start("llama-1", "gpu-a", [0])
        fleet.start("llama-2", "gpu-a", [1])
        operator()
        sign_in(page, "operator")
        grid = page.context.new_page()
        grid.set_default_timeout(15_000)
        grid.goto("/nodes/")
        grid.evaluate(f"{MARKER} = 'still here'")
        assert node_section(grid, "gpu-a").locator(".free-count").inner_text() == "2 free"
        assert grid.locator("#node-results").get_attribute("hx-trigger") == "every 1s"
        page.goto("/nodes/gpu-a/")
        page.evaluate(f"{MARKER} = 'still here'")
        body = page.locator("#node-body")
        assert body.locator("tr", has_text="llama-1").count() == 1

        with acting_as(Actor(via="cli", name="pytest")):
            (op,) = node_drain(node_name="gpu-a")
        # Cordoned at once: the grid's badge follows.
        node_section(grid, "gpu-a").locator(".badge.state-cordoned").wait_for()
        assert run_operation(op.pk) == "succeeded"
        assert RestartOperation.objects.get(pk=op.pk).state == "succeeded"

        page.locator("#node-body", has_text="No replica holds a card on this node.").wait_for()
        node_section(grid, "gpu-a").locator(".free-count", has_text="4 free").wait_for()
        node_section(grid, "gpu-b").locator(".free-count", has_text="2 free").wait_for()
        grid.locator("#fleet-summary .totals", has_text="8 cards, 6 free").wait_for()
        assert page.evaluate(MARKER) == "still here"  # swapped in, not reloaded
        assert grid.evaluate(MARKER) == "still here"
        assert fleet.ready_on_agents() == {"gpu-a": 0, "gpu-b": 2}


def test_a_node_whose_agent_stops_answering_is_never_shown_ready(page, tmp_path, fast_restarts):
    """gpu-b's agent process is frozen (it accepts connections and never answers); the sampler and
    the reconciler find it silent; the open grid and gpu-b's page say "not answering", count it, and
    grey its readings with their age, without a reload."""
    from operations.services.reconcile import reconcile
    from telemetry.services import fleet_sample
    from tests.support.restart import fleet_of

    fast_restarts.LLMGW_PAGE_POLL_SECONDS = 1
    with fleet_of(tmp_path, nodes=("gpu-a", "gpu-b"), cards=2, gpus=True) as fleet:
        fleet.start("llama-1", "gpu-b", [0])
        assert fleet_sample() == {"gpu-a": True, "gpu-b": True}
        # Short, so the frozen agent is given up on soon; not 1 s, which a live agent's answer (its
        # stand-in nvidia-smi a process of its own) overran on a CI machine loaded to 14.
        fast_restarts.LLMGW_AGENT_TIMEOUT_SECONDS = 3.0
        b.user("viewer", password=PASSWORD)
        sign_in(page, "viewer")
        page.goto("/nodes/")
        page.evaluate(f"{MARKER} = 'still here'")
        gpu_b = node_section(page, "gpu-b")
        assert gpu_b.locator(".badge").inner_text() == "Ready"
        assert page.locator("#fleet-summary .unreachable-count").inner_text() == "not answering 0 nodes"

        frozen = fleet.agents["gpu-b"].process
        os.kill(frozen.pid, signal.SIGSTOP)
        try:
            assert fleet_sample() == {"gpu-a": True, "gpu-b": False}
            reconcile()
            gpu_b.locator(".badge.state-unreachable", has_text="Not answering").wait_for()
            assert gpu_b.locator(".badge.state-ready").count() == 0
            assert "Ready" not in gpu_b.locator(".node-head").inner_text()
            assert "not answering" in gpu_b.locator(".seen").inner_text()
            reading = gpu_b.locator(".card.held .use.stale")
            assert reading.count() == 1 and " ago" in reading.inner_text()  # greyed, with its age
            page.locator("#fleet-summary .unreachable-count", has_text="1 node").wait_for()
            assert node_section(page, "gpu-a").locator(".badge.state-unreachable").count() == 0
            assert page.evaluate(MARKER) == "still here"

            page.goto("/nodes/gpu-b/")
            head = page.locator(".page-head")
            assert head.locator(".badge.state-unreachable").inner_text() == "Not answering"
            assert "Ready" not in head.inner_text()
            assert page.locator("#node-body .badge.state-ready").count() == 0
        finally:
            os.kill(frozen.pid, signal.SIGCONT)


def test_a_card_a_foreign_process_holds_is_counted_held_and_names_its_pid(page, tmp_path, fast_restarts):
    """The stand-in nvidia-smi reports a process the agent did not start on gpu-a's card 2; the grid
    counts that card held (in the node's and the fleet's counts), names the process and its PID,
    and the node's page says the same."""
    from agent_fakes import foreign_process

    from telemetry.services import fleet_sample
    from tests.support.restart import fleet_of

    with fleet_of(tmp_path, nodes=("gpu-a",), cards=4, gpus=True) as fleet:
        fleet.start("llama-1", "gpu-a", [0])
        with foreign_process(fleet.gpu_dirs["gpu-a"], [2], used_mib=10240) as pid:
            assert fleet_sample() == {"gpu-a": True}
            b.user("viewer", password=PASSWORD)
            sign_in(page, "viewer")
            page.goto("/nodes/")
            gpu_a = node_section(page, "gpu-a")
            assert gpu_a.locator(".free-count").inner_text() == "2 free"  # 4 cards, llama-1 and the process
            card = gpu_a.locator(".card.foreign-held")
            assert card.count() == 1
            assert "card 2" in card.inner_text().lower()
            assert f"held by python3 foreign.py (PID {pid})" in card.inner_text()
            assert "free" not in card.locator(".holder").inner_text()
            summary = page.locator("#fleet-summary")
            assert "4 cards, 2 free, 1 held by foreign processes" in summary.locator(".totals").inner_text()
            row = summary.locator("tbody tr").first
            cells = row.locator("td")
            assert (cells.nth(2).inner_text(), cells.nth(3).inner_text()) == ("2", "2")  # free, held
            assert "foreign processes 1" in cells.nth(4).inner_text()

            page.goto("/nodes/gpu-a/")
            assert f"(PID {pid})" in page.locator("#node-body .card.foreign-held").inner_text()
