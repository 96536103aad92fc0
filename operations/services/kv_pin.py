"""Pinning a profile's KV pool to what its replicas measured, so the pool is the same on every node.

After a replica's first start its engine says how much memory it gave the KV cache on each card
(vLLM's "Available KV cache memory", read by the agent: ``Replica.measured_memory["kv_cache"]``).
``kv_pin`` offers the smallest such figure over the profile's replicas on its current revision (the
pool every one of them could hold), rounded down to a MiB, as the profile's
``--kv-cache-memory-bytes`` (vLLM, and the stand-in that plays it: vLLM then ignores
``--gpu-memory-utilization`` for the pool); applying it writes the argument through ``profile_save``,
the one audited, policy-checked save every path takes (the revision goes up; a restart puts it in
force). TensorRT-LLM takes its pool's tokens only from ``KvCacheConfig.max_tokens`` in an
``--extra_llm_api_options`` file, which the launch policy does not pass: not offered, and the answer
says why; nor for the other engines, which have no such argument.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import transaction

from base.actor import Actor
from base.errors import DomainError, not_found
from catalog.models import Profile, Replica
from catalog.services.catalog import profile_save
from planning.engines import drop_spellings, engine, int_value

FLAG = "--kv-cache-memory-bytes"
PINNABLE = ("vllm", "standin")
MIB = 2**20
_NOT_OFFERED = {
    "trtllm": "TensorRT-LLM takes its KV pool's tokens only from KvCacheConfig.max_tokens in an "
    "--extra_llm_api_options file, which the launch policy does not pass",
}


@dataclass
class KvPin:
    model: str
    profile: str
    kv_bytes: int
    measured_on: list[str]
    args_before: list[str]
    args_after: list[str]
    applied: bool = False
    revision: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "profile": self.profile,
            "flag": FLAG,
            "kv_bytes": self.kv_bytes,
            "measured_on": self.measured_on,
            "args_before": self.args_before,
            "args_after": self.args_after,
            "applied": self.applied,
            "revision": self.revision,
        }


def _profile(model: str, profile: str) -> Profile:
    found = (
        Profile.objects.select_related("model", "gpu_class").filter(model__name=model, name=profile).first()
    )
    if found is None:
        raise not_found(f"No profile {profile!r} of model {model!r} in the catalog.")
    return found


def kv_pin(*, model: str, profile: str, dry_run: bool = True, actor: Actor | None = None) -> KvPin:
    """The pin offered for ``model``'s ``profile`` (``dry_run``), or written."""
    p = _profile(model, profile)
    if p.engine not in PINNABLE:
        why = _NOT_OFFERED.get(p.engine, f"the {p.engine} engine has no argument that pins its KV pool")
        raise DomainError("not_pinnable", f"{model}/{profile}: not offered: {why}.")
    measured = [
        (r.name, r.measured_memory.get("kv_cache"))
        for r in Replica.objects.filter(profile=p, revision=p.revision)
        .exclude(measured_memory={})
        .order_by("name")
    ]
    figures = [(name, v) for name, v in measured if isinstance(v, int | float) and v > 0]
    if not figures:
        raise DomainError(
            "not_measured",
            f"{model}/{profile}: no replica on its revision {p.revision} has said its KV pool yet (its engine "
            "prints it as it starts): start one first.",
            status=409,
        )
    kv = int(min(v for _, v in figures)) // MIB * MIB
    eng = engine(p.engine)
    args = list(p.args)
    after = [*drop_spellings(eng, args, [FLAG]), FLAG, str(kv)]
    pin = KvPin(
        model=model,
        profile=profile,
        kv_bytes=kv,
        measured_on=[name for name, _ in figures],
        args_before=args,
        args_after=after,
    )
    if dry_run:
        return pin
    if int_value(eng, args, [FLAG]) == kv:
        raise DomainError("unchanged", f"{model}/{profile} already pins its KV pool at {kv} bytes.")
    with transaction.atomic():
        p.args = after
        saved = profile_save(
            instance=p,
            actor=actor,
            action="pin_kv",
            message=f"KV pool pinned at {kv} bytes a card ({FLAG}), the smallest its replicas measured: "
            + ", ".join(pin.measured_on),
        )
    pin.applied, pin.revision = True, saved.revision
    return pin
