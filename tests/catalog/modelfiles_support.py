"""What the model-files tests share: the real Hugging Face configs in tests/fixtures/hf-configs, a
safetensors index and a real safetensors file written on the spot, and the shape of a refusal."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest

from base.errors import DomainError

FIXTURES = Path(__file__).parents[1] / "fixtures" / "hf-configs"


def load(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def index(total_size: Any) -> dict[str, Any]:
    """A safetensors index as the Hub writes it, reduced to what the reader uses."""
    return {"metadata": {"total_size": total_size}, "weight_map": {}}


def write_safetensors(path: Path, tensors: dict[str, int], *, metadata: dict[str, str] | None = None) -> Path:
    """A real safetensors file: 8-byte little-endian header length, the JSON header, then the data.

    ``tensors`` maps a name to its size in bytes; each is stored as U8 of that length.
    """
    header: dict[str, Any] = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    offset = 0
    for name, size in tensors.items():
        header[name] = {"dtype": "U8", "shape": [size], "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)  # the format pads the header to 8 bytes with spaces
    path.write_bytes(
        struct.pack("<Q", len(raw)) + raw + bytes(range(256)) * (offset // 256) + bytes(offset % 256)
    )
    return path


def refusal(excinfo: pytest.ExceptionInfo[DomainError]) -> str:
    assert excinfo.value.code == "bad_checkpoint"
    assert excinfo.value.status == 400
    return excinfo.value.message
