"""The safetensors index's total size, and config.json and the index as uploaded bytes: what is
accepted, and what is refused with the file and where in it."""

from __future__ import annotations

from typing import Any

import pytest

from base.errors import DomainError
from catalog.modelfiles import parse_config_bytes, parse_index_bytes, shape_from_config
from tests.catalog.modelfiles_support import index, load, refusal

# ---- Index and uploaded bytes -----------------------------------------------


def test_index_total_size_as_a_string_of_digits_is_accepted() -> None:
    shape = shape_from_config(load("meta-llama__Llama-3.1-8B-Instruct"), index=index("16060522496"))

    assert shape.weight_bytes == 16060522496


@pytest.mark.parametrize("total", ["16 GB", -5, 0, 1.6e10, True, [1]])
def test_bad_index_total_size_is_refused_naming_file_and_field(total: Any) -> None:
    with pytest.raises(DomainError) as excinfo:
        shape_from_config(
            load("meta-llama__Llama-3.1-8B-Instruct"), index=index(total), index_source="idx.json"
        )

    assert refusal(excinfo).startswith("idx.json: metadata.total_size is ")


def test_index_without_total_size_leaves_weights_unknown_and_says_why() -> None:
    shape = shape_from_config(load("meta-llama__Llama-3.1-8B-Instruct"), index={"weight_map": {}})

    assert shape.weight_bytes is None
    assert any("has no metadata.total_size" in n for n in shape.notes)


def test_index_wins_over_header_for_the_weights() -> None:
    header = {"model.embed_tokens.weight": {"dtype": "U8", "shape": [10], "data_offsets": [0, 10]}}

    shape = shape_from_config(
        load("meta-llama__Llama-3.1-8B-Instruct"), index=index(16060522496), header=header
    )

    assert shape.weight_bytes == 16060522496


def test_parse_config_bytes_reads_an_object() -> None:
    assert parse_config_bytes(b'\xef\xbb\xbf{"num_hidden_layers": 2}') == {"num_hidden_layers": 2}


def test_invalid_json_is_refused_with_file_line_and_column() -> None:
    with pytest.raises(DomainError) as excinfo:
        parse_config_bytes(
            b'{\n  "num_hidden_layers": 32,\n  "num_attention_heads": ,\n}', name="upload/config.json"
        )

    message = refusal(excinfo)
    assert message.startswith("upload/config.json is not valid JSON")
    assert "line 3, column 26" in message


@pytest.mark.parametrize(
    ("data", "words"),
    [(b"[1, 2]", "is a list"), (b'"text"', "is a string"), (b"\xff\xfe{}", "is not UTF-8")],
)
def test_config_bytes_that_are_not_an_object_are_refused(data: bytes, words: str) -> None:
    with pytest.raises(DomainError) as excinfo:
        parse_config_bytes(data)

    assert refusal(excinfo).startswith(f"config.json {words}")


def test_parse_index_bytes_checks_total_size() -> None:
    good = parse_index_bytes(
        b'{"metadata": {"total_size": 42}, "weight_map": {"a": "model-00001-of-00001.safetensors"}}'
    )
    assert good["metadata"]["total_size"] == 42

    with pytest.raises(DomainError) as excinfo:
        parse_index_bytes(b'{"metadata": {"total_size": "lots"}}')
    assert refusal(excinfo).startswith("model.safetensors.index.json: metadata.total_size is 'lots'")


def test_index_naming_a_shard_outside_its_directory_is_refused() -> None:
    with pytest.raises(DomainError) as excinfo:
        parse_index_bytes(b'{"metadata": {"total_size": 42}, "weight_map": {"a": "../../etc/passwd"}}')

    assert "weight_map gives '../../etc/passwd'" in refusal(excinfo)
