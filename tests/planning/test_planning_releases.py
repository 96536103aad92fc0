"""Engine releases compared, their ranges, and the floors a release puts on a node (planning/releases.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from planning.engines import RegistryError, engine, load_registry
from planning.releases import (
    Floor,
    NodeFacts,
    check_range,
    floor_of,
    newer,
    node_refusal,
    parse_version,
    release_in,
)


@pytest.mark.parametrize(
    ("later", "earlier"),
    [
        ("0.19.1", "0.19.0"),
        ("0.10.0", "0.9.2"),  # by numbers, not by text
        ("1.0.0", "1.0.0rc4"),  # a release after its candidates
        ("1.0.0rc4", "1.0.0rc3"),
        ("0.11.0rc1", "0.11.0.dev3"),
        ("0.5.10.post1", "0.5.10"),
        ("b5100", "b5000"),  # llama.cpp's builds
        ("580.65.06", "575.57.08"),  # drivers
        ("13.0", "12.9"),
    ],
)
def test_releases_compare_as_the_engines_number_them(later, earlier):
    assert newer(later, earlier)
    assert not newer(earlier, later)


def test_a_release_equals_itself_with_trailing_zeros_and_nothing_unreadable_is_newer():
    assert parse_version("13") == parse_version("13.0.0")
    assert not newer("13.0", "13")
    assert parse_version("latest") is None
    assert not newer("latest", "0.1")


def test_ranges_hold_every_bound():
    assert release_in("0.19.1", ">=0.11, <0.20")
    assert not release_in("0.20.0", ">=0.11, <0.20")
    assert not release_in("0.10.2", ">=0.11, <0.20")
    assert release_in("anything", "*")
    assert check_range(">=0.11, <0.20") is None
    assert "not a bound" in (check_range(">=0.11, about 0.2") or "")


FREETOKEN = Floor(releases="*", capability="8.0", driver="580", cuda="13.0", arch=("x86_64",), source="seed")


def facts(**kw: Any) -> NodeFacts:
    base: dict[str, Any] = dict(
        node="gpu-a", known=True, driver="580.65.06", cuda="13.0", arch="x86_64", engines={}
    )
    return NodeFacts(**(base | kw))


def test_a_node_whose_driver_is_575_is_refused_naming_580():
    err = node_refusal("freetoken", "", FREETOKEN, facts(driver="575.57.08"))
    assert err is not None and err.code == "driver"
    assert "580" in err.message and "575.57.08" in err.message and "gpu-a" in err.message


def test_an_aarch64_node_is_refused_naming_the_architecture():
    err = node_refusal("freetoken", "", FREETOKEN, facts(arch="aarch64"))
    assert err is not None and err.code == "arch"
    assert "x86_64" in err.message and "aarch64" in err.message


def test_cuda_and_capability_floors_name_their_figures():
    err = node_refusal("freetoken", "", FREETOKEN, facts(cuda="12.9"))
    assert err is not None and err.code == "cuda" and "13.0" in err.message and "12.9" in err.message
    err = node_refusal("freetoken", "", FREETOKEN, facts(), capability="7.5")
    assert err is not None and err.code == "capability" and "8.0" in err.message and "7.5" in err.message


def test_a_node_that_meets_the_floor_and_has_the_release_passes():
    assert node_refusal("freetoken", "0.2.1", FREETOKEN, facts(engines={"freetoken": "0.2.1"})) is None
    # amd64 is x86-64 by another name
    assert node_refusal("freetoken", "", FREETOKEN, facts(arch="amd64")) is None


def test_a_release_the_node_has_not_installed_is_refused_naming_both():
    err = node_refusal("vllm", "0.19.1", None, facts(engines={"vllm": "0.11.0"}))
    assert err is not None and err.code == "release_missing"
    assert "0.19.1" in err.message and "0.11.0" in err.message
    err = node_refusal("vllm", "0.19.1", None, facts(engines={}))
    assert err is not None and "has no vllm installed" in err.message


def test_a_node_whose_agent_never_reported_is_not_refused_for_what_is_not_known():
    unknown = NodeFacts(node="gpu-b")
    assert node_refusal("freetoken", "0.2.1", FREETOKEN, unknown) is None
    # ... but its cards' capability is the catalog's own, and is checked
    assert node_refusal("freetoken", "", FREETOKEN, unknown, capability="7.5") is not None


def test_the_floor_of_a_release_is_the_first_range_holding_it_and_unknown_takes_the_newest():
    old = Floor(releases="<0.3", driver="550", source="s")
    new = Floor(releases=">=0.3", driver="580", source="s")
    assert floor_of((old, new), "0.2.1") is old
    assert floor_of((old, new), "0.3.0") is new
    assert floor_of((old, new), "") is new
    assert floor_of((), "0.3.0") is None


def test_freetokens_floor_in_the_registry_is_the_seeds():
    floor = floor_of(engine("freetoken").floors, "")
    assert floor is not None
    assert (floor.capability, floor.driver, floor.cuda, floor.arch) == ("8.0", "580", "13.0", ("x86_64",))
    assert "seed" in floor.source
    assert engine("vllm").package == "vllm" and engine("trtllm").package == "tensorrt-llm"


def test_a_bad_floor_in_the_registry_stops_loading_naming_it(tmp_path: Path):
    text = (Path(__file__).parents[2] / "planning" / "engines.toml").read_text()
    bad = tmp_path / "engines.toml"
    seed = 'releases = "*"\ncapability = "8.0"\ndriver = "580"'
    assert seed in text
    bad.write_text(text.replace(seed, 'releases = "*"\ncapability = "8.0"\ndriver = "new enough"'))
    with pytest.raises(RegistryError, match=r"freetoken.*floors\[0\]\.driver"):
        load_registry(bad)


# -- the other engines' floors in the registry (engines.toml, each with its source) ------------------


def _registry_refusal(name: str, release: str, capability: str = "", **kw: Any):
    eng = engine(name)
    installed = {name: release} if release else {}
    return node_refusal(
        name, release, floor_of(eng.floors, release), facts(engines=installed, **kw), capability=capability
    )


def test_vllm_from_0_20_needs_cuda_13_and_driver_580_where_0_19_runs_on_a_cuda_12_driver():
    cuda12 = {"driver": "550.54.14", "cuda": "12.4"}
    assert _registry_refusal("vllm", "0.19.1", capability="8.0", **cuda12) is None
    err = _registry_refusal("vllm", "0.20.0", capability="8.0", **cuda12)
    assert err is not None and err.code == "driver"
    assert "580" in err.message and "550.54.14" in err.message and "gpu-a" in err.message
    err = _registry_refusal("vllm", "0.21.1", capability="8.0", driver="580.65.06", cuda="12.9")
    assert err is not None and err.code == "cuda" and "13.0" in err.message and "12.9" in err.message


def test_vllm_from_0_20_refuses_a_volta_card_naming_7_5_where_0_19_takes_it():
    assert _registry_refusal("vllm", "0.19.1", capability="7.0") is None
    err = _registry_refusal("vllm", "0.20.0", capability="7.0")
    assert err is not None and err.code == "capability" and "7.5" in err.message and "7.0" in err.message
    # a release not known takes the newest floor, and says so by naming no release
    err = _registry_refusal("vllm", "", capability="7.0")
    assert err is not None and err.code == "capability"


def test_vllm_releases_with_aarch64_wheels_take_an_arm_node_and_none_takes_ppc64le():
    assert _registry_refusal("vllm", "0.19.1", capability="9.0", arch="aarch64") is None
    err = _registry_refusal("vllm", "0.21.0", capability="9.0", arch="ppc64le")
    assert err is not None and err.code == "arch" and "aarch64" in err.message and "ppc64le" in err.message


def test_sglang_after_its_last_cuda_12_release_needs_cuda_13():
    cuda12 = {"driver": "575.57.08", "cuda": "12.9"}
    assert _registry_refusal("sglang", "0.5.19", capability="8.0", **cuda12) is None
    err = _registry_refusal("sglang", "0.5.20", capability="8.0", **cuda12)
    assert err is not None and err.code == "driver" and "580" in err.message
    err = _registry_refusal("sglang", "0.5.19", capability="7.0")
    assert err is not None and err.code == "capability" and "7.5" in err.message


def test_tensorrt_llm_needs_an_ampere_card_on_x86_64_or_aarch64():
    err = _registry_refusal("trtllm", "1.0.0", capability="7.5")
    assert err is not None and err.code == "capability" and "8.0" in err.message and "7.5" in err.message
    assert _registry_refusal("trtllm", "1.0.0", capability="8.0", arch="aarch64") is None
    err = _registry_refusal("trtllm", "1.0.0", capability="8.0", arch="ppc64le")
    assert err is not None and err.code == "arch"


def test_llamacpp_builds_for_maxwell_and_newer():
    err = _registry_refusal("llamacpp", "b6500", capability="3.7")
    assert err is not None and err.code == "capability" and "5.0" in err.message
    assert _registry_refusal("llamacpp", "b6500", capability="5.0", driver="470.256.02", cuda="11.4") is None


def test_every_engines_floor_names_its_source():
    for name in ("vllm", "sglang", "trtllm", "llamacpp", "freetoken"):
        floors = engine(name).floors
        assert floors, name
        assert all(f.source.strip() for f in floors), name
