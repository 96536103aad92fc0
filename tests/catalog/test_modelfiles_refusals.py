"""A config.json field that cannot be read is refused, naming the file and the field."""

from __future__ import annotations

from typing import Any

import pytest

from base.errors import DomainError
from catalog.modelfiles import shape_from_config
from tests.catalog.modelfiles_support import load, refusal

# ---- Refusals, each naming the file and the field ---------------------------


@pytest.mark.parametrize(
    ("field", "value", "shown"),
    [
        pytest.param("num_attention_heads", "abc", "'abc'", id="string-heads"),
        pytest.param("num_attention_heads", -32, "-32", id="negative-heads"),
        pytest.param("num_hidden_layers", 0, "0", id="zero-layers"),
        pytest.param("num_key_value_heads", 2.5, "2.5", id="fractional-kv-heads"),
        pytest.param("hidden_size", True, "True", id="bool-hidden"),
        pytest.param("max_position_embeddings", "131072", "'131072'", id="string-context"),
        pytest.param("head_dim", [128], "[128]", id="list-head-dim"),
    ],
)
def test_a_bad_count_is_refused_naming_file_and_field(field: str, value: Any, shown: str) -> None:
    config = load("meta-llama__Llama-3.1-8B-Instruct")
    config[field] = value

    with pytest.raises(DomainError) as excinfo:
        shape_from_config(config, source="llama/config.json")

    message = refusal(excinfo)
    assert message.startswith(f"llama/config.json: {field} is {shown}, expected a whole number")
    assert f"Correct {field} in llama/config.json" in message


def test_a_bad_count_inside_text_config_is_named_with_its_path() -> None:
    config = load("google__gemma-3-27b-it")
    config["text_config"]["num_key_value_heads"] = "sixteen"

    with pytest.raises(DomainError) as excinfo:
        shape_from_config(config)

    assert "config.json: text_config.num_key_value_heads is 'sixteen'" in refusal(excinfo)


def test_heads_that_kv_heads_do_not_divide_are_refused() -> None:
    config = load("meta-llama__Llama-3.1-8B-Instruct")
    config["num_key_value_heads"] = 5

    with pytest.raises(DomainError) as excinfo:
        shape_from_config(config)

    message = refusal(excinfo)
    assert "config.json" in message and "num_key_value_heads" in message


@pytest.mark.parametrize(
    ("field", "value"),
    [("torch_dtype", 16), ("use_sliding_window", "no"), ("text_config", [1]), ("mlp_only_layers", 3)],
)
def test_other_malformed_fields_are_refused_by_name(field: str, value: Any) -> None:
    config = load("Qwen__Qwen3-30B-A3B")
    config[field] = value

    with pytest.raises(DomainError) as excinfo:
        shape_from_config(config)

    assert f"config.json: {field} is" in refusal(excinfo)


def test_config_that_is_not_an_object_is_refused() -> None:
    with pytest.raises(DomainError) as excinfo:
        shape_from_config([1, 2], source="x/config.json")  # type: ignore[arg-type]  # the bad input under test

    assert refusal(excinfo).startswith("x/config.json is a list")
