"""Safetensors files on this host: a file or a directory, its index and its shards, the headers'
exact weight and expert bytes, and every way a file is refused."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from base.errors import DomainError
from catalog.modelfiles import MAX_HEADER_BYTES, ModelFilesShape, read_model_files, read_safetensors_header
from tests.catalog.modelfiles_support import load, refusal, write_safetensors

# ---- Safetensors files ------------------------------------------------------


def test_single_safetensors_file_gives_exact_weight_and_expert_bytes(tmp_path: Path) -> None:
    file = write_safetensors(
        tmp_path / "model.safetensors",
        {"model.layers.0.mlp.experts.0.down_proj.weight": 4 * 8 * 2, "model.embed_tokens.weight": 16 * 4 * 2},
        metadata={"format": "pt"},
    )

    shape = read_model_files(file)

    assert shape.weight_bytes == 4 * 8 * 2 + 16 * 4 * 2
    assert shape.expert_bytes == 4 * 8 * 2
    assert shape.as_fields() | {"weight_bytes": None, "expert_bytes": None} == ModelFilesShape().as_fields()
    (note,) = shape.notes
    assert note.startswith("shape unknown: no config.json beside")


def test_header_expert_bytes_are_exact_and_leave_out_shared_experts(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(load("mistralai__Mixtral-8x7B-v0.1")))
    write_safetensors(
        tmp_path / "model.safetensors",
        {
            "model.layers.0.block_sparse_moe.experts.0.w1.weight": 96,
            "model.layers.0.block_sparse_moe.experts.1.w1.weight": 32,
            "model.layers.0.mlp.shared_experts.gate_proj.weight": 64,
            "model.layers.0.mlp.shared_expert.up_proj.weight": 8,
            "model.layers.0.mlp.experts.shared_expert.down_proj.weight": 4,
            "model.norm.weight": 16,
        },
    )

    shape = read_model_files(tmp_path)

    assert shape.weight_bytes == 96 + 32 + 64 + 8 + 4 + 16
    assert shape.expert_bytes == 96 + 32
    assert shape.layers == 32
    assert not any("expert bytes derived" in n for n in shape.notes)


def test_directory_with_config_and_index(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(load("meta-llama__Llama-3.1-8B-Instruct")))
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps(
            {"metadata": {"total_size": 16060522496}, "weight_map": {"a": "model-00001-of-00004.safetensors"}}
        )
    )

    shape = read_model_files(tmp_path)

    assert shape.weight_bytes == 16060522496
    assert shape.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2
    assert not any(n.startswith("weight bytes unknown") for n in shape.notes)


def test_index_with_its_shards_present_reads_their_headers_for_the_experts(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(load("Qwen__Qwen3-30B-A3B")))
    write_safetensors(
        tmp_path / "model-00001-of-00002.safetensors", {"model.layers.0.mlp.experts.0.up_proj.weight": 40}
    )
    write_safetensors(
        tmp_path / "model-00002-of-00002.safetensors", {"model.layers.1.mlp.experts.3.up_proj.weight": 24}
    )
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps(
            {
                "metadata": {"total_size": 61064245248},
                "weight_map": {
                    "model.layers.0.mlp.experts.0.up_proj.weight": "model-00001-of-00002.safetensors",
                    "model.layers.1.mlp.experts.3.up_proj.weight": "model-00002-of-00002.safetensors",
                },
            }
        )
    )

    shape = read_model_files(tmp_path)

    assert shape.weight_bytes == 61064245248
    assert shape.expert_bytes == 40 + 24


def test_sharded_safetensors_without_index_sum_every_header(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(load("meta-llama__Llama-3.1-8B-Instruct")))
    write_safetensors(tmp_path / "model-00001-of-00002.safetensors", {"a": 100, "b": 28})
    write_safetensors(tmp_path / "model-00002-of-00002.safetensors", {"c": 72})
    # Another copy of the same weights in the original format, as Mistral's repositories carry.
    write_safetensors(tmp_path / "consolidated.safetensors", {"a": 100, "b": 28, "c": 72})

    assert read_model_files(tmp_path).weight_bytes == 100 + 28 + 72


def test_sharded_safetensors_with_a_shard_missing_are_refused(tmp_path: Path) -> None:
    write_safetensors(tmp_path / "model-00001-of-00003.safetensors", {"a": 8})
    write_safetensors(tmp_path / "model-00003-of-00003.safetensors", {"c": 8})

    with pytest.raises(DomainError) as excinfo:
        read_model_files(tmp_path)

    assert "incomplete or mixed set of safetensors shards" in refusal(excinfo)


def test_one_shard_alone_is_refused(tmp_path: Path) -> None:
    file = write_safetensors(tmp_path / "model-00002-of-00004.safetensors", {"a": 8})

    with pytest.raises(DomainError) as excinfo:
        read_model_files(file)

    assert "is shard 2 of 4" in refusal(excinfo)


def test_truncated_header_is_refused_naming_the_file(tmp_path: Path) -> None:
    file = write_safetensors(tmp_path / "model.safetensors", {"a": 8})
    file.write_bytes(file.read_bytes()[:20])

    with pytest.raises(DomainError) as excinfo:
        read_model_files(file)

    message = refusal(excinfo)
    assert message.startswith(str(file)) and "truncated" in message


def test_truncated_data_is_refused_naming_the_file_and_tensor(tmp_path: Path) -> None:
    file = write_safetensors(tmp_path / "model.safetensors", {"first": 8, "last": 1000})
    file.write_bytes(file.read_bytes()[:-10])

    with pytest.raises(DomainError) as excinfo:
        read_model_files(file)

    message = refusal(excinfo)
    assert message.startswith(f"{file}: tensor 'last' ends at byte 1008")
    assert "truncated" in message


def test_file_shorter_than_the_length_prefix_is_refused(tmp_path: Path) -> None:
    file = tmp_path / "model.safetensors"
    file.write_bytes(b"\x10\x00\x00")

    with pytest.raises(DomainError) as excinfo:
        read_safetensors_header(file)

    assert "too short to hold the 8-byte header length" in refusal(excinfo)


def test_absurd_header_length_is_refused_before_reading_it(tmp_path: Path) -> None:
    file = tmp_path / "model.safetensors"
    file.write_bytes(struct.pack("<Q", MAX_HEADER_BYTES + 1) + b"{}")
    # Long enough to hold the declared header (sparse, so it costs no disk):
    # only the limit can refuse it.
    with file.open("r+b") as handle:
        handle.truncate(8 + MAX_HEADER_BYTES + 16)

    with pytest.raises(DomainError) as excinfo:
        read_model_files(file)

    message = refusal(excinfo)
    assert message.startswith(f"{file} declares a {MAX_HEADER_BYTES + 1}-byte header, over the")
    assert f"{MAX_HEADER_BYTES}-byte limit" in message


def test_header_that_is_not_json_is_refused_with_line_and_column(tmp_path: Path) -> None:
    file = tmp_path / "model.safetensors"
    raw = b'{"a": {"data_offsets": [0, 8}}  '
    file.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(8))

    with pytest.raises(DomainError) as excinfo:
        read_model_files(file)

    message = refusal(excinfo)
    assert message.startswith(f"{file} (header) is not valid JSON") and "line 1, column" in message


def test_header_with_bad_offsets_is_refused_naming_the_tensor(tmp_path: Path) -> None:
    file = tmp_path / "model.safetensors"
    raw = json.dumps({"w": {"dtype": "U8", "shape": [8], "data_offsets": [8, 0]}}).encode()
    file.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(8))

    with pytest.raises(DomainError) as excinfo:
        read_model_files(file)

    assert refusal(excinfo).startswith(f"{file}: tensor 'w' has data_offsets [8, 0]")


def test_bad_config_in_a_directory_names_its_path(tmp_path: Path) -> None:
    config = load("meta-llama__Llama-3.1-8B-Instruct")
    config["num_attention_heads"] = "abc"
    (tmp_path / "config.json").write_text(json.dumps(config))

    with pytest.raises(DomainError) as excinfo:
        read_model_files(tmp_path)

    assert refusal(excinfo).startswith(f"{tmp_path / 'config.json'}: num_attention_heads is 'abc'")


@pytest.mark.parametrize("name", ["missing", "empty", "notes.txt"])
def test_a_path_that_is_not_a_checkpoint_is_refused(tmp_path: Path, name: str) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes.txt").write_text("hello")

    with pytest.raises(DomainError):
        read_model_files(tmp_path / name)


# ---- Properties --------------------------------------------------------------


@given(
    sizes=st.lists(st.integers(1, 300), min_size=1, max_size=6),
    expert_mask=st.lists(st.booleans(), min_size=6),
)
def test_header_sums_are_exact_for_any_tensor_sizes(
    tmp_path_factory: pytest.TempPathFactory, sizes: list[int], expert_mask: list[bool]
) -> None:
    names = [
        f"model.layers.{i}.mlp.experts.0.w" if expert_mask[i] else f"model.layers.{i}.w"
        for i in range(len(sizes))
    ]
    file = write_safetensors(
        tmp_path_factory.mktemp("st") / "model.safetensors", dict(zip(names, sizes, strict=True))
    )

    shape = read_model_files(file)

    assert shape.weight_bytes == sum(sizes)
    assert shape.expert_bytes == (sum(s for s, e in zip(sizes, expert_mask, strict=False) if e) or None)
