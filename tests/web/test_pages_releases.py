"""The engine releases page (the fleet's defaults, the release watch, an upgrade's dry run and its
button) and a node's reported facts on its page."""

from __future__ import annotations

import pytest
from django.utils import timezone

from catalog.models import EngineDefault, Node
from operations.models import ReleaseCheck, RestartOperation
from tests.support import builders as b

pytestmark = pytest.mark.django_db


@pytest.fixture
def fleet():
    EngineDefault.objects.create(engine="freetoken", version="0.2.1")
    node = b.node("gpu-a", cards=2)
    node.driver_version, node.cuda_version, node.arch = "575.57.08", "12.9", "x86_64"
    node.engines, node.facts_at = {"freetoken": "0.2.1"}, timezone.now()
    node.save()
    profile = b.profile(b.llama_8b("ft-model"), engine="freetoken", args=["--max-seq-len-override", "8192"])
    b.replica(profile, node, [0])
    ReleaseCheck.objects.create(
        index_url="http://127.0.0.1:9/simple",
        results=[
            {
                "engine": "freetoken",
                "package": "freetoken",
                "default": "0.2.1",
                "newest": "0.3.0",
                "newer": True,
                "error": "",
            }
        ],
    )
    return node


def test_the_page_shows_defaults_the_watch_and_floors_and_the_dry_run_names_what_stops(fleet, operator):
    page = operator.get("/releases/").content.decode()
    assert "0.3.0" in page and "newer than the default" in page
    assert "driver 580+" in page and "x86_64 only" in page
    page = operator.get("/releases/", {"engine": "freetoken", "release": "0.3.0"}).content.decode()
    assert "ft-model" in page and "would no longer run" in page
    assert "needs NVIDIA driver 580 or newer" in page and "575.57.08" in page
    assert EngineDefault.objects.get().version == "0.2.1"  # a dry run


def test_the_upgrade_button_refuses_while_a_profile_would_stop_and_changes_nothing(fleet, operator):
    operator.post("/releases/upgrade/", {"engine": "freetoken", "release": "0.3.0"})
    assert "Nothing was changed" in operator.get("/releases/").content.decode()
    assert EngineDefault.objects.get().version == "0.2.1" and not RestartOperation.objects.exists()


def test_the_upgrade_button_applies_it_when_every_profile_still_runs(fleet, operator):
    Node.objects.filter(pk=fleet.pk).update(
        driver_version="580.65.06", cuda_version="13.0", engines={"freetoken": "0.3.0"}
    )
    operator.post("/releases/upgrade/", {"engine": "freetoken", "release": "0.3.0"})
    assert "is 0.3.0 now" in operator.get("/releases/").content.decode()
    assert EngineDefault.objects.get().version == "0.3.0"
    assert RestartOperation.objects.get().model.name == "ft-model"


def test_a_nodes_page_shows_what_its_agent_reports_or_that_it_has_not(fleet, viewer):
    page = viewer.get("/nodes/gpu-a/").content.decode()
    assert "575.57.08" in page and "12.9" in page and "freetoken 0.2.1" in page
    b.node("gpu-quiet", cards=1)
    page = viewer.get("/nodes/gpu-quiet/").content.decode()
    assert "has not said yet what it has" in page


def test_the_model_page_offers_an_editor_the_measured_kv_pool_and_its_button_pins_it():
    from catalog.models import Profile
    from tests.web.pages_support import signed_in

    profile = b.profile(b.llama_8b(), args=["--max-num-seqs", "64"])
    r = b.replica(profile, b.node("gpu-a", cards=2), [0])
    r.measured_memory = {"kv_cache": 30 * 2**30}
    r.save()
    editor = signed_in(b.user("ed", roles=("editor",)))
    page = editor.get("/models/llama-3.1-8b/").content.decode()
    assert f"at {30 * 2**30} bytes" in page
    editor.post("/models/llama-3.1-8b/profiles/default/pin-kv/")
    assert Profile.objects.get(pk=profile.pk).args[-2:] == ["--kv-cache-memory-bytes", str(30 * 2**30)]
    assert "is pinned at" in editor.get("/models/llama-3.1-8b/").content.decode()
    # A viewer is offered nothing.
    assert "KV cache pool" not in signed_in(b.user("viewer")).get("/models/llama-3.1-8b/").content.decode()


def test_a_profile_on_the_fleets_default_release_is_shown_with_that_releases_memory_terms(viewer):
    """The model page plans a profile without its own release by the fleet's default of its engine:
    under vLLM 0.16.1 its CUDA graphs are captured outside the budget, 0.05 GiB and 2.5% of the card's
    weights (engines.toml, the 0.11 to 0.16 table), where the current releases count 1 GiB inside."""
    from planning.units import gib

    model = b.llama_8b("default-release")
    b.profile(model)
    current = viewer.get(f"/models/{model.name}/").content.decode()
    assert "CUDA graphs 1.0 GiB</span>" in current and "(outside the budget)" not in current

    EngineDefault.objects.create(engine="vllm", version="0.16.1")
    page = viewer.get(f"/models/{model.name}/").content.decode()
    graphs = 0.05 * 2**30 + 0.025 * model.weight_bytes
    assert f"CUDA graphs {gib(graphs)} GiB (outside the budget)" in page
    assert "logged by vLLM 0.11 at TP 1" in page  # the older range's source, beside its figure
    # a profile with its own release keeps it, whatever the default
    pinned = b.profile(model, name="pinned")
    pinned.engine_version = "0.21.0"
    pinned.save()
    page = viewer.get(f"/models/{model.name}/").content.decode()
    assert page.count("(outside the budget)") == 1 and "CUDA graphs 1.0 GiB</span>" in page
