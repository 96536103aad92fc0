"""A model's source: a Hugging Face repo id, optionally pinned to a revision,
or an absolute path under the model roots."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

from .model import Refusal, excerpt

# huggingface_hub's validate_repo_id: [\w.-] names, at most 96 characters,
# neither "--" nor ".." inside; here the "org/" part is required.
_REPO_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_REVISION = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
_PATH_CHARS = re.compile(r"[A-Za-z0-9_.@+=,/-]+")


def parse_roots(text: str) -> tuple[str, ...]:
    """Model roots from a comma- or colon-separated list; empty items dropped."""
    return tuple(part.strip().rstrip("/") or "/" for part in re.split(r"[,:]", text or "") if part.strip())


def split_source(source: str) -> tuple[str, str | None]:
    """A repo id source as (repo, revision); a path as (path, None)."""
    if not source.startswith("/") and "@" in source:
        repo, revision = source.rsplit("@", 1)
        return repo, revision
    return source, None


def source_refusal(source: str, roots: Sequence[str]) -> Refusal | None:
    """Why ``source`` cannot be a model's source, or None: it must be a
    Hugging Face repo id (``org/name``, optionally ``@revision``) or an
    absolute path under one of ``roots``."""
    if not isinstance(source, str) or not source:
        return Refusal("refused_source", "source", "A model's source must be a repo id or a path.")
    shown = excerpt(source)
    if source.startswith("/"):
        if not roots:
            return Refusal(
                "refused_source",
                "source",
                f"The source {shown!r} is a path, and no model roots are configured: set "
                "LLMGW_MODEL_ROOTS (and model_roots on the agents) to the directories models live in, "
                "or give a Hugging Face repo id.",
            )
        if (
            not _PATH_CHARS.fullmatch(source)
            or os.path.normpath(source) != source
            or "/../" in source + "/"
            or "/./" in source + "/"
        ):
            return Refusal(
                "refused_source",
                "source",
                f"The source {shown!r} is not a plain absolute path (no '..', '.', '//', trailing '/' "
                "or characters beyond letters, digits and _.@+=,-).",
            )
        for root in roots:
            if root == "/" or source == root or source.startswith(root + "/"):
                return None
        return Refusal(
            "refused_source",
            "source",
            f"The source {shown!r} is not under the model roots ({', '.join(roots)}); "
            "move the checkpoint there or ask an operator to add its directory to LLMGW_MODEL_ROOTS.",
        )
    repo, revision = split_source(source)
    parts = repo.split("/")
    ok = (
        len(parts) == 2
        and all(_REPO_PART.fullmatch(p) for p in parts)
        and len(repo) <= 96
        and "--" not in repo
        and ".." not in repo
        and not repo.endswith(".git")
    )
    if ok and revision is not None and not _REVISION.fullmatch(revision):
        return Refusal(
            "refused_source",
            "source",
            f"The revision in {shown!r} must be a branch, tag or commit: letters, digits, '_', '-', '.'.",
        )
    if not ok:
        return Refusal(
            "refused_source",
            "source",
            f"The source {shown!r} is neither a Hugging Face repo id (org/name, optionally @revision) "
            "nor an absolute path under the model roots.",
        )
    return None
