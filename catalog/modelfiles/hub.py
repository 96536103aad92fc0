"""A model's shape from a Hugging Face repo: only ``config.json`` and
``model.safetensors.index.json``, fetched with ``huggingface_hub``, which honours
``HF_TOKEN``, ``HF_ENDPOINT``, its cache (``HF_HOME``/``HF_HUB_CACHE``) and
offline mode (``HF_HUB_OFFLINE=1``). What cannot be fetched is refused with a
``DomainError`` saying what is wrong and how to fix it.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

from base.errors import DomainError
from catalog.modelfiles.config import parse_config_bytes, shape_from_config
from catalog.modelfiles.safetensors import INDEX_NAME, parse_index_bytes
from catalog.modelfiles.shape import CODE, ModelFilesShape

# Hugging Face's own rule for repo ids (huggingface_hub.utils.validate_repo_id): one optional namespace.
REPO_ID = re.compile(r"^(?:[\w.\-]{1,96}/)?[\w.\-]{1,96}$")


def looks_like_repo_id(text: str) -> bool:
    """A repo id ("org/name"), not a path: no leading "/" or ".", one slash at most, nothing on disk."""
    return (
        bool(REPO_ID.match(text))
        and "/" in text
        and not text.startswith((".", "/"))
        and ".." not in text
        and not Path(text).exists()
    )


def shape_from_hub(repo_id: str, *, revision: str | None = None) -> ModelFilesShape:
    """The shape of a Hugging Face model repo from its config.json and safetensors index."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    if not looks_like_repo_id(repo_id):
        raise DomainError(
            CODE,
            f"{repo_id!r} is not a Hugging Face repo id: give it as org/name, e.g. meta-llama/Llama-3.1-8B.",
        )

    def fetch(filename: str, *, required: bool) -> bytes | None:
        try:
            path = hf_hub_download(repo_id, filename, revision=revision)
        except LocalEntryNotFoundError:  # before EntryNotFoundError, of which it is a kind
            if not required:
                return None
            raise DomainError(
                CODE,
                f"{repo_id}'s {filename} is not in the Hugging Face cache and the Hub cannot be reached "
                "(HF_HUB_OFFLINE, or no network): download it once, or point HF_ENDPOINT at a mirror.",
            ) from None
        except EntryNotFoundError:
            if required:
                raise DomainError(CODE, f"{repo_id} has no {filename}; is it a model repository?") from None
            return None
        except GatedRepoError:
            raise DomainError(
                CODE,
                f"{repo_id} is gated: accept its licence on the Hub and set HF_TOKEN to a token that may read it.",
            ) from None
        except RepositoryNotFoundError:
            raise DomainError(
                CODE,
                f"{repo_id} is not on the Hub (or is private): check the name, or set HF_TOKEN for a private repo.",
            ) from None
        except RevisionNotFoundError:
            raise DomainError(CODE, f"{repo_id} has no revision {revision!r}.") from None
        except HfHubHTTPError as exc:
            raise DomainError(
                CODE, f"The Hub refused {repo_id}/{filename}: {exc}.".replace("..", ".")
            ) from None
        return Path(path).read_bytes()

    config_bytes = fetch("config.json", required=True)
    assert config_bytes is not None
    config = parse_config_bytes(config_bytes, f"{repo_id}/config.json")
    index_bytes = fetch(INDEX_NAME, required=False)
    index = parse_index_bytes(index_bytes, f"{repo_id}/{INDEX_NAME}") if index_bytes is not None else None
    shape = shape_from_config(
        config, index=index, source=f"{repo_id}/config.json", index_source=f"{repo_id}/{INDEX_NAME}"
    )
    if index is None:
        shape = _with_note(
            shape,
            f"{repo_id} has no {INDEX_NAME} (a single-file checkpoint): its weights are unknown until "
            "imported from a local copy, and the memory check is skipped",
        )
    return shape


def _with_note(shape: ModelFilesShape, note: str) -> ModelFilesShape:
    return replace(shape, notes=(*shape.notes, note))
