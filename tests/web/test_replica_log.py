"""A replica's engine log on its page: the length the operator chooses, following it live, a download
as a file, and a silent agent said quickly ("agent not answering"), not waited on."""

from __future__ import annotations

import socket
import time

import pytest

from catalog.models import Replica
from tests.support import builders as b
from tests.support.restart import fleet_of
from tests.web.pages_support import HX, signed_in

pytestmark = pytest.mark.django_db


def test_the_log_follows_at_the_chosen_length_and_downloads_as_a_file(tmp_path, fast_restarts):
    with fleet_of(tmp_path, nodes=("gpu-a",), cards=1) as fleet:
        fleet.start("llama-1", "gpu-a", [0])
        viewer = signed_in(b.user("viewer"))
        page = viewer.get("/replicas/llama-1/").content.decode()
        assert '<option value="500">last 500</option>' in page and "Follow live" in page
        assert 'formaction="/replicas/llama-1/log.txt"' in page

        ready = viewer.get("/replicas/llama-1/log/?lines=50", **HX).content.decode()
        assert "data-polling" not in ready and "listening on" in ready  # ready, not followed: still
        followed = viewer.get("/replicas/llama-1/log/?lines=50&follow=1", **HX).content.decode()
        assert 'hx-get="/replicas/llama-1/log/?lines=50&amp;follow=1" hx-trigger="every 2s"' in followed
        assert "· following." in followed
        # A length not offered is the default, not passed on to the agent as given.
        odd = viewer.get("/replicas/llama-1/log/?lines=100000&follow=1", **HX).content.decode()
        assert "lines=200&amp;follow=1" in odd

        download = viewer.get("/replicas/llama-1/log.txt?lines=50")
        assert download.status_code == 200
        assert download["Content-Type"] == "text/plain; charset=utf-8"
        assert download["Content-Disposition"] == 'attachment; filename="llama-1-log.txt"'
        text = download.content.decode()
        assert "listening on" in text and len(text.splitlines()) <= 50


def test_a_silent_agent_does_not_hold_the_page_it_is_said_not_answering(settings):
    settings.LLMGW_LOG_TIMEOUT_SECONDS = 0.5
    silent = socket.socket()  # accepts connections (the kernel's backlog) and never answers
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    try:
        node = b.node("gpu-1", agent_url=f"http://127.0.0.1:{silent.getsockname()[1]}")
        b.replica(b.profile(b.llama_8b("llama"), "h100"), node, [0], name="llama-1")
        Replica.objects.filter(name="llama-1").update(state="loading")
        viewer = signed_in(b.user("viewer"))
        began = time.monotonic()
        html = viewer.get("/replicas/llama-1/log/", **HX).content.decode()
        took = time.monotonic() - began
        assert took < 2, took
        assert "Agent not answering" in html and "did not answer within 0.5 s" in html
        assert "data-polling" not in html  # no poll on an agent that does not answer
        began = time.monotonic()
        download = viewer.get("/replicas/llama-1/log.txt")
        assert time.monotonic() - began < 2
        assert download.status_code == 504 and "Agent not answering" in download.content.decode()
    finally:
        silent.close()


def test_each_start_attempts_log_is_kept_and_the_first_failure_of_a_crash_loop_can_be_read(
    tmp_path, fast_restarts
):
    from catalog.models import Profile
    from operations.services.specs import replica_spec

    with fleet_of(tmp_path, nodes=("gpu-a",), cards=1) as fleet:
        replica = b.replica(
            fleet.profile, fleet.nodes["gpu-a"], [0], name="llama-1", port=free_port_of(fast_restarts)
        )
        agent = fleet.agents["gpu-a"]
        spec = replica_spec(
            Profile.objects.select_related("model").get(pk=fleet.profile.pk), port=replica.port, cards=[0]
        )
        for code in ("3", "4"):  # a crash loop: each start exits with its own code
            spec["env"] = {**spec["env"], "STANDIN_EXIT_AT_START": code}
            with agent.client() as http:
                assert http.put("/v1/replicas/llama-1", json=spec).status_code == 201
            agent.wait_for_state("llama-1", "failed")
        Replica.objects.filter(pk=replica.pk).update(state="failed")
        viewer = signed_in(b.user("viewer"))
        time.sleep(0.6)  # past the agent's read interval for this replica's log
        latest = viewer.get("/replicas/llama-1/log/", **HX).content.decode()
        assert (
            "Start attempts kept:" in latest and "#1 (the first kept)" in latest and "#2 (this run)" in latest
        )
        assert "exiting with code 4" in latest and "exiting with code 3" not in latest
        first = viewer.get("/replicas/llama-1/log/?attempt=1", **HX).content.decode()
        assert "of start attempt 1, which has ended," in first
        assert "exiting with code 3" in first and "data-polling" not in first
        download = viewer.get("/replicas/llama-1/log.txt?attempt=1")
        assert download["Content-Disposition"] == 'attachment; filename="llama-1-attempt-1-log.txt"'
        assert "exiting with code 3" in download.content.decode()


def free_port_of(settings) -> int:
    return settings.LLMGW_REPLICA_PORT_BASE + 7
