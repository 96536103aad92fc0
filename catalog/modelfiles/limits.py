"""How much of a model's files is read: the sizes past which a file is refused rather than
parsed, and the bounded JSON parser every config, index and header goes through."""

from __future__ import annotations

import json
from typing import Any

from base.errors import DomainError
from catalog.modelfiles.shape import bad, json_type

# Real headers are a few MiB even for models with tens of thousands of tensors;
# a larger length means the file is not safetensors, and reading it would only
# fill memory.
MAX_HEADER_BYTES = 100 * 1024 * 1024

# A config.json is a few kB and a safetensors index a few MB: beyond these a file is not one (or is
# built to exhaust the parser), and is refused with a sentence before or while it is parsed.
MAX_JSON_BYTES = 16 * 1024 * 1024
MAX_JSON_DIGITS = 30  # an integer in a model's settings: no count or size needs more


def _json_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_JSON_DIGITS:
        raise bad(
            f"a number of {len(text.lstrip('-'))} digits, more than the {MAX_JSON_DIGITS} any model setting "
            "needs: the file is not a model's settings as published."
        )
    return int(text)


def parse_json_object(data: bytes, name: str, what: str, *, limit: int = MAX_JSON_BYTES) -> dict[str, Any]:
    if len(data) > limit:
        raise bad(
            f"{name} is {len(data)} bytes, over the {limit // 2**20} MiB such a file may be: "
            "it is not the file the model publishes."
        )
    try:
        text = data.decode("utf-8-sig")  # tolerate a byte-order mark from Windows editors
    except UnicodeDecodeError as exc:
        raise bad(
            f"{name} is not UTF-8 text (bad byte at offset {exc.start}); upload the file as downloaded."
        ) from exc
    try:
        value = json.loads(text, parse_int=_json_int)
    except DomainError as exc:
        raise bad(f"{name} holds {exc.message}") from None
    except RecursionError:
        raise bad(
            f"{name} nests its values too deeply to read (hundreds of levels): no model's settings do."
        ) from None
    except json.JSONDecodeError as exc:
        raise bad(
            f"{name} is not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}. "
            f"Fix it there or download {name} again."
        ) from exc
    if not isinstance(value, dict):
        raise bad(f"{name} is {json_type(value)}, expected a JSON object {what}.")
    return value
