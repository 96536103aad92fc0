"""A release's floors and the release itself against what each node's agent reported: a change's plan
and a restart's placement refuse a node that fails one, naming the floor and the figures."""

from __future__ import annotations

import pytest
from django.utils import timezone

from base.errors import DomainError
from catalog.models import EngineDefault, Node
from operations.services.placement import best_fit, in_place_cards
from operations.services.resize import model_set_context
from tests.support import builders as b

pytestmark = pytest.mark.django_db

GOOD = {"driver_version": "580.65.06", "cuda_version": "13.0", "arch": "x86_64"}


def report(node: Node, **facts) -> Node:
    """The node as if its agent had reported these facts (the reconciler writes them)."""
    for key, value in {**GOOD, "engines": {"freetoken": "0.2.1"}, **facts}.items():
        setattr(node, key, value)
    node.facts_at = timezone.now()
    node.save()
    return node


@pytest.fixture
def freetoken():
    model = b.llama_8b("ft-model")
    profile = b.profile(model, engine="freetoken", args=["--max-seq-len-override", "8192"])
    return model, profile


def test_a_freetoken_profile_onto_a_node_whose_agent_reports_driver_575_is_refused_naming_580(freetoken):
    model, profile = freetoken
    report(b.node("gpu-old", cards=2), driver_version="575.57.08")
    with pytest.raises(DomainError) as caught:
        model_set_context(name=model.name, tokens=16384, dry_run=True)
    assert caught.value.code == "driver"
    assert "580" in caught.value.message and "575.57.08" in caught.value.message
    assert best_fit(profile) is None  # the restart's placement refuses it too


def test_a_freetoken_profile_onto_an_aarch64_node_is_refused_naming_the_architecture(freetoken):
    model, profile = freetoken
    report(b.node("gpu-arm", cards=2), arch="aarch64")
    with pytest.raises(DomainError) as caught:
        model_set_context(name=model.name, tokens=16384, dry_run=True)
    assert caught.value.code == "arch"
    assert "aarch64" in caught.value.message and "x86_64" in caught.value.message
    assert best_fit(profile) is None


def test_the_node_that_meets_the_floor_is_the_one_chosen(freetoken):
    model, profile = freetoken
    report(b.node("gpu-a-old", cards=1), driver_version="575.57.08")
    report(b.node("gpu-b-new", cards=2))
    change = model_set_context(name=model.name, tokens=16384, dry_run=True)
    assert change.room is not None and change.room.beside == ("gpu-b-new",)
    fit = best_fit(profile)
    assert fit is not None and fit[0].name == "gpu-b-new"


def test_a_node_whose_agent_never_reported_is_used_and_the_answer_says_its_facts_are_unknown(freetoken):
    model, profile = freetoken
    b.node("gpu-quiet", cards=2)
    change = model_set_context(name=model.name, tokens=16384, dry_run=True)
    assert "gpu-quiet" in change.note and "not known" in change.note
    fit = best_fit(profile)
    assert fit is not None and fit[0].name == "gpu-quiet"


def test_a_profile_release_the_node_does_not_have_is_refused_naming_both(freetoken):
    model, profile = freetoken
    profile.engine_version = "0.3.0"
    profile.save()
    report(b.node("gpu-a", cards=2))  # has freetoken 0.2.1
    with pytest.raises(DomainError) as caught:
        model_set_context(name=model.name, tokens=16384, dry_run=True)
    assert caught.value.code == "release_missing"
    assert "0.3.0" in caught.value.message and "0.2.1" in caught.value.message
    assert "gpu-a" in caught.value.message


def test_the_fleet_default_is_the_release_of_a_profile_without_its_own(freetoken):
    model, profile = freetoken
    report(b.node("gpu-a", cards=2))
    EngineDefault.objects.create(engine="freetoken", version="0.4.0")
    with pytest.raises(DomainError) as caught:
        model_set_context(name=model.name, tokens=16384, dry_run=True)
    assert caught.value.code == "release_missing" and "0.4.0" in caught.value.message


def test_in_place_on_a_node_that_fails_a_floor_is_refused(freetoken):
    model, profile = freetoken
    node = report(b.node("gpu-old", cards=2), driver_version="575.57.08")
    old = b.replica(profile, node, [0])
    said = in_place_cards(profile, old, node)
    assert isinstance(said, str) and "580" in said and "575.57.08" in said


def test_a_save_onto_a_class_below_the_releases_capability_floor_is_refused_naming_it():
    from catalog.models import Profile
    from catalog.services.catalog import profile_save

    turing = b.gpu_class("rtx6000-24g", memory_mib=24576, usable_mib=22000, capability="7.5")
    model = b.llama_8b("ft-small")
    with pytest.raises(DomainError) as caught:
        profile_save(
            instance=Profile(model=model, name="ft", engine="freetoken", gpu_class=turing, args=[]),
        )
    assert caught.value.code == "capability"
    assert "8.0" in caught.value.message and "7.5" in caught.value.message
    assert not Profile.objects.filter(model=model).exists()


def test_a_release_that_is_not_a_release_number_is_refused_on_save(freetoken):
    from catalog.services.catalog import profile_save

    _, profile = freetoken
    profile.engine_version = "latest"
    with pytest.raises(DomainError, match="not a release number"):
        profile_save(instance=profile)


def test_a_restart_onto_nodes_that_fail_the_floor_is_refused_before_it_starts_naming_it(freetoken, actor):
    from catalog.models import Replica
    from operations.models import RestartOperation
    from operations.services.start import restart_start

    model, profile = freetoken
    node = report(b.node("gpu-old", cards=2), driver_version="575.57.08")
    b.replica(profile, node, [0], name="ft-model-1")
    profile.revision = 2  # its replica is stale
    profile.save()
    with pytest.raises(DomainError) as caught:
        restart_start(model_name=model.name, replicas=["ft-model-1"])
    assert caught.value.code == "driver" and "580" in caught.value.message
    assert not RestartOperation.objects.exists()
    assert Replica.objects.get(name="ft-model-1").state == "ready"


def test_a_vllm_profile_on_volta_cards_saves_at_0_19_and_is_refused_at_0_21_naming_7_5(actor):
    from catalog.models import Profile
    from catalog.services.catalog import profile_save

    volta = b.gpu_class("v100-32g", memory_mib=32768, usable_mib=29500, capability="7.0")
    model = b.llama_8b("vllm-on-volta", context_length=8192)
    saved = profile_save(
        instance=Profile(
            model=model, name="v19", engine="vllm", engine_version="0.19.1", gpu_class=volta, args=[]
        ),
        actor=actor,
    )
    assert saved.pk is not None
    with pytest.raises(DomainError) as caught:
        profile_save(
            instance=Profile(
                model=model, name="v21", engine="vllm", engine_version="0.21.0", gpu_class=volta, args=[]
            ),
            actor=actor,
        )
    assert caught.value.code == "capability"
    assert (
        "vllm 0.21.0" in caught.value.message
        and "7.5" in caught.value.message
        and "7.0" in caught.value.message
    )
    assert not Profile.objects.filter(model=model, name="v21").exists()
