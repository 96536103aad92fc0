"""config.json's fields as transformers reads them: each field's spellings, the
text model's fields before the top level's, and the defaults a model type fills in."""

from __future__ import annotations

from typing import Any

from catalog.modelfiles.shape import bad, json_type, show

# Each field's spellings, in the order they are tried: transformers' own name
# first, then the GPT-2/Falcon/ChatGLM/T5 ones still found on the Hub.
LAYER_NAMES = ("num_hidden_layers", "n_layer", "num_layers")
HEAD_NAMES = ("num_attention_heads", "n_head", "num_heads")
KV_HEAD_NAMES = ("num_key_value_heads", "num_kv_heads", "n_head_kv")
HIDDEN_NAMES = ("hidden_size", "n_embd", "d_model")
CONTEXT_NAMES = ("max_position_embeddings", "max_sequence_length", "seq_length", "n_positions")
EXPERT_NAMES = ("num_local_experts", "num_experts", "n_routed_experts")

# What transformers fills in when a config leaves a field out, for the model
# types whose configs on the Hub rely on it (facts from transformers'
# configuration_gemma3.py, configuration_gemma2.py, configuration_gpt_oss.py
# and configuration_cohere2.py). A pattern of N: every Nth layer attends to the
# full context, the others keep only the window.
MODEL_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma3_text": {
        "num_hidden_layers": 26,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "hidden_size": 2304,
        "max_position_embeddings": 131072,
        "sliding_window": 4096,
        "sliding_window_pattern": 6,
    },
    "gemma2": {"sliding_window_pattern": 2},
    "gpt_oss": {"sliding_window_pattern": 2},
    "cohere2": {"sliding_window_pattern": 4},
}
# A multimodal config names its text model's type only in text_config, if at all.
TEXT_MODEL_TYPES = {"gemma3": "gemma3_text"}

_ABSENT = object()


def whole(value: Any, *, file: str, field: str, minimum: int) -> int:
    """``value`` as an int of at least ``minimum``, or a DomainError naming the file and field."""
    # bool is an int in Python but never a count in a config; 32.0 is a count
    # some tools write, 32.5 is not.
    number: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, float) and value.is_integer():
        number = int(value)
    if number is None or number < minimum:
        wanted = "a whole number greater than zero" if minimum > 0 else "a whole number, zero or more"
        raise bad(
            f"{file}: {field} is {show(value)}, expected {wanted}. "
            f"Correct {field} in {file} (compare it with the model's published config.json)."
        )
    return number


class ConfigFields:
    """Looks fields up in a config: the text model's first, then the top level, then the type's defaults."""

    def __init__(self, config: dict[str, Any], source: str):
        self.source = source
        self.top = config
        text = config.get("text_config")
        if text is not None and not isinstance(text, dict):
            raise bad(
                f"{source}: text_config is {json_type(text)}, expected an object holding the text model's fields."
            )
        self.text: dict[str, Any] = text or {}
        model_type = self.text.get("model_type")
        if not isinstance(model_type, str):
            top_type = config.get("model_type")
            top_type = top_type if isinstance(top_type, str) else ""
            model_type = TEXT_MODEL_TYPES.get(top_type, top_type) if text is not None else top_type
        self.model_type = model_type
        self.defaults = MODEL_DEFAULTS.get(model_type, {})
        self.defaults_used: dict[str, Any] = {}

    def present(self, name: str) -> bool:
        return name in self.text or name in self.top

    def find(self, *names: str) -> tuple[str, Any] | None:
        """The first of ``names`` given a value, as (label for messages, value); None when none is.

        A field written as null counts as not given; the type's defaults fill
        only fields left out entirely, as transformers does.
        """
        for level, prefix in ((self.text, "text_config."), (self.top, "")):
            for name in names:
                value = level.get(name, _ABSENT)
                if value is not _ABSENT and value is not None:
                    return prefix + name, value
        for name in names:
            if name in self.defaults and not self.present(name):
                self.defaults_used[name] = self.defaults[name]
                return f"{self.model_type} default {name}", self.defaults[name]
        return None

    def count(self, *names: str, minimum: int = 1) -> int | None:
        found = self.find(*names)
        if found is None:
            return None
        label, value = found
        return whole(value, file=self.source, field=label, minimum=minimum)

    def flag(self, name: str) -> bool | None:
        found = self.find(name)
        if found is None:
            return None
        label, value = found
        if not isinstance(value, bool):
            raise bad(
                f"{self.source}: {label} is {show(value)}, expected true or false. Correct it in {self.source}."
            )
        return value
