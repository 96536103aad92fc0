"""Declared models: loaded from the cluster's settings file (TOML), read-only elsewhere."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.db import transaction

from base.errors import DomainError
from catalog.models import GPUClass, Profile, ServedModel
from catalog.services.catalog import model_save, profile_delete, profile_save, set_shape
from planning.types import SHAPE_FIELDS

MODEL_KEYS = {"name", "source", "context_length", "checkpoint", "profiles", *SHAPE_FIELDS}
PROFILE_KEYS = {"name", "engine", "gpu_class", "gpus_per_node", "tp", "nodes", "pp", "args", "env"}


@dataclass
class SyncResult:
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    released: list[str] = field(default_factory=list)


def _bad(path: Path, where: str, what: str) -> DomainError:
    return DomainError("bad_settings", f"{path}: {where}: {what}. Nothing was changed.")


def _check_table(path: Path, where: str, table: Any, *, allowed: set[str], required: tuple[str, ...]) -> None:
    """A table of the file: only known keys, and the required ones as non-empty strings."""
    if not isinstance(table, dict):
        raise _bad(path, where, "must be a table")
    unknown = set(table) - allowed
    if unknown:
        raise _bad(path, where, f"unknown key(s) {', '.join(sorted(unknown))}")
    for key in required:
        if not isinstance(table.get(key), str) or not table[key]:
            raise _bad(path, f"{where}.{key}", "is required and must be a string")


def load_cluster_settings(path: Path) -> list[dict[str, Any]]:
    """The declared models of the file, checked key by key; refuses anything unknown."""
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise DomainError(
            "bad_settings", f"{path}: no such file; set LLMGW_CLUSTER_SETTINGS to its path."
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise DomainError("bad_settings", f"{path}: not valid TOML: {exc}. Nothing was changed.") from None
    models = data.get("models", [])
    if not isinstance(models, list):
        raise _bad(path, "models", "must be an array of tables ([[models]])")
    names: set[str] = set()
    for i, m in enumerate(models):
        where = f"models[{i}]"
        _check_table(path, where, m, allowed=MODEL_KEYS, required=("name", "source"))
        if m["name"] in names:
            raise _bad(path, f"{where}.name", f"{m['name']!r} is declared twice")
        names.add(m["name"])
        profiles = m.get("profiles", [])
        if not isinstance(profiles, list):
            raise _bad(path, f"{where}.profiles", "must be an array of tables ([[models.profiles]])")
        for j, p in enumerate(profiles):
            _check_table(path, f"{where}.profiles[{j}]", p, allowed=PROFILE_KEYS, required=("name", "engine"))
    return models


def _shape_of(path: Path, m: dict[str, Any]) -> dict[str, Any]:
    shape = {k: m[k] for k in SHAPE_FIELDS if k in m}
    if "checkpoint" in m:
        from catalog.modelfiles import read_model_files

        model_files = (path.parent / m["checkpoint"]).resolve()
        shape = {**read_model_files(model_files).as_fields(), **shape}
    if "context_length" in m:
        shape["context_length"] = m["context_length"]
    return shape


def sync_cluster_settings(*, path: Path) -> SyncResult:
    """Make the catalog's declared models match the file, all or nothing, each change audited."""
    declared = load_cluster_settings(path)
    result = SyncResult()
    where = str(path)
    with transaction.atomic():
        for m in declared:
            shape = _shape_of(path, m)
            model = ServedModel.objects.filter(name=m["name"]).first()
            is_new = model is None
            if model is None:
                model = ServedModel(name=m["name"])
            model.source = m["source"]
            set_shape(model, shape)
            model.declared, model.declared_in = True, where
            try:
                model = model_save(instance=model, from_settings=True)
            except DomainError as exc:
                raise DomainError(exc.code, f"{path}: model {m['name']}: {exc.message}") from exc
            (result.created if is_new else result.updated).append(model.name)
            wanted = {p["name"] for p in m.get("profiles", [])}
            for dropped in model.profiles.exclude(name__in=wanted):
                profile_delete(instance=dropped, from_settings=True)
            for p in m.get("profiles", []):
                profile = Profile.objects.filter(model=model, name=p["name"]).first() or Profile(model=model)
                profile.name = p["name"]
                profile.engine = p["engine"]
                class_name = p.get("gpu_class")
                if class_name:
                    gpu_class = GPUClass.objects.filter(name=class_name).first()
                    if gpu_class is None:
                        raise _bad(
                            path,
                            f"model {m['name']} profile {p['name']}",
                            f"no GPU class {class_name!r}; add it in the admin first",
                        )
                    profile.gpu_class = gpu_class
                else:
                    profile.gpu_class = None
                for key in ("gpus_per_node", "tp", "nodes", "pp"):
                    setattr(profile, key, p.get(key, {"pp": 0}.get(key, 1)))
                profile.args = p.get("args", [])
                profile.env = p.get("env", {})
                try:
                    profile_save(instance=profile, from_settings=True)
                except DomainError as exc:
                    raise DomainError(
                        exc.code, f"{path}: model {m['name']} profile {p['name']}: {exc.message}"
                    ) from exc
        names = {m["name"] for m in declared}
        for gone in ServedModel.objects.filter(declared=True).exclude(name__in=names):
            # No longer declared: kept, and editable here again, rather than torn down.
            gone.declared, gone.declared_in = False, ""
            model_save(instance=gone, from_settings=True)
            result.released.append(gone.name)
    return result


__all__ = ["SyncResult", "load_cluster_settings", "sync_cluster_settings"]
