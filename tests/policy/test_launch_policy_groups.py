"""The rank flags of a replica across nodes: the launch policy makes them from a rank's group
(``llmgw_policy.group_args``), the control plane's ``planning.engines.launch_args`` appends them,
and the agent's own parse and check (``parse_spec``, ``check_spec``) accept exactly those and
refuse any other, for every engine that can span nodes; the others are refused with a reason."""

from __future__ import annotations

import pytest
from llmgw_agent.spec import parse_spec
from llmgw_policy import GroupSpec, PolicyError, check_spec, default_policy, group_args

from planning import engines

POLICY = default_policy()
SPANNING = sorted(name for name, eng in POLICY.engines.items() if eng.group and eng.group.args)
NOT_SPANNING = sorted(set(POLICY.engines) - set(SPANNING))


def test_the_engines_that_span_nodes_are_the_ones_with_rank_flags():
    assert SPANNING == ["sglang", "standin", "vllm"]
    assert NOT_SPANNING == ["freetoken", "llamacpp", "trtllm"]


def test_vllm_ranks_get_the_multiprocessing_flags_and_every_rank_but_0_is_headless():
    vllm = POLICY.engines["vllm"]
    head = group_args(vllm, 0, 2, "gpu-a.fleet", 29501)
    tail = group_args(vllm, 1, 2, "gpu-a.fleet", 29501)

    common = ["--pipeline-parallel-size", "2", "--nnodes", "2", "--master-addr", "gpu-a.fleet"]
    assert head == [*common[:4], "--node-rank", "0", *common[4:], "--master-port", "29501"]
    assert tail == [*common[:4], "--node-rank", "1", *common[4:], "--master-port", "29501", "--headless"]


def test_sglang_ranks_get_its_dist_init_address():
    assert group_args(POLICY.engines["sglang"], 1, 2, "10.0.0.7", 5000) == [
        "--nnodes",
        "2",
        "--node-rank",
        "1",
        "--dist-init-addr",
        "10.0.0.7:5000",
    ]


@pytest.mark.parametrize("name", NOT_SPANNING)
def test_an_engine_that_cannot_span_nodes_gets_no_rank_flags_and_says_why(name):
    with pytest.raises(PolicyError, match=f"{name} cannot run a replica across nodes here: "):
        engines.launch_args(
            engines.engine(name),
            source="org/m",
            port=8123,
            model="m",
            tp=1,
            args=[],
            group=GroupSpec(0, 2, "gpu-a", 29500),
        )


@pytest.mark.parametrize("name", SPANNING)
@pytest.mark.parametrize("rank", [0, 1, 2])
def test_what_the_control_plane_writes_for_a_rank_the_agent_accepts(name, rank):
    group = GroupSpec(rank, 3, "gpu-a.fleet", 29500)
    body = {
        "engine": name,
        "model": "m",
        "args": engines.launch_args(
            engines.engine(name), source="org/m", port=8123, model="m", tp=8, args=[], group=group
        ),
        "cards": list(range(8)),
        "port": 8123,
        "group": group.as_dict(),
    }
    spec = parse_spec(body)

    assert spec.group == group and spec.headless == (rank > 0)
    assert check_spec(POLICY, name, list(spec.args), [], port=8123, model="m", group=spec.group) == []
    # The same arguments without the group, or with another rank's, are refused.
    alone = check_spec(POLICY, name, list(spec.args), [], port=8123, model="m")
    assert alone and alone[0].code == "refused_arg" and "from the spec's group" in alone[0].sentence
    other = GroupSpec((rank + 1) % 3, 3, "gpu-a.fleet", 29500)
    (mismatch,) = check_spec(POLICY, name, list(spec.args), [], port=8123, model="m", group=other)
    assert mismatch.code == "launch_mismatch"


def test_a_wrong_group_is_refused_before_a_spec_is_made():
    with pytest.raises(PolicyError, match="The replica's group is wrong: rank must be from 0 to 1"):
        engines.launch_args(
            engines.engine("vllm"),
            source="org/m",
            port=8123,
            model="m",
            tp=8,
            args=[],
            group=GroupSpec(2, 2, "a", 29500),
        )


def test_a_one_node_spec_is_as_before():
    line = engines.launch_args(
        engines.engine("vllm"), source="org/m", port=8123, model="m", tp=2, args=["--seed", "1"]
    )

    assert line == [
        "org/m",
        "--port",
        "8123",
        "--served-model-name",
        "m",
        "--tensor-parallel-size",
        "2",
        "--seed",
        "1",
    ]
    spec = parse_spec({"engine": "vllm", "model": "m", "args": line, "cards": [0, 1], "port": 8123})
    assert spec.group is None and "group" not in spec.as_dict()
