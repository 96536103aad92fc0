"""The entry point of a check: a profile's arguments and environment against
the policy, within its limits (``check_profile``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from .arguments import ContextRule, check_args
from .environment import check_env
from .model import Limits, Policy, Refusal, excerpt


def check_profile(
    policy: Policy,
    engine: str,
    args: Sequence[str],
    env: Mapping[str, str] | Iterable[tuple[str, str]] = (),
    *,
    context: bool = True,
    context_max: int | None = None,
) -> list[Refusal]:
    """Every reason the arguments and environment of a profile of ``engine``
    may not be passed; empty when they may.

    ``context``: the engine's context flag may appear once (the context
    operation wrote it), at most ``context_max`` when that is known; when
    False it is refused like the launcher's other flags.
    """
    eng = policy.engines.get(engine)
    if eng is None:
        known = ", ".join(sorted(policy.engines))
        return [
            Refusal(
                "refused_arg",
                engine,
                f"The engine {engine!r} is not in the launch policy (it knows {known}), "
                "so nobody has said which of its arguments are safe.",
            )
        ]
    # By name, as the agent holds a spec's environment: both sides say the same first.
    pairs = sorted(list(env.items()) if isinstance(env, Mapping) else list(env), key=lambda kv: str(kv[0]))
    out = _limits(policy.limits, args, pairs)
    if out:
        return out
    out += check_args(eng, args, ContextRule(context, context_max, policy.limits.max_context))
    out += check_env(policy, eng, pairs)
    # A flag given twice is one reason, said once.
    unique: dict[tuple[str, str], Refusal] = {}
    for refusal in out:
        unique.setdefault((refusal.subject, refusal.sentence), refusal)
    return list(unique.values())


def _limits(limits: Limits, args: Sequence[str], env: list[tuple[str, str]]) -> list[Refusal]:
    out = []
    if len(args) > limits.max_args:
        out.append(
            Refusal(
                "too_large",
                "args",
                f"The profile has {len(args)} arguments; at most {limits.max_args} are accepted.",
            )
        )
    sizes = [len(a.encode("utf-8", "surrogatepass")) for a in args]
    for arg, size in zip(args, sizes, strict=True):
        if size > limits.max_arg_bytes:
            out.append(
                Refusal(
                    "too_large",
                    excerpt(arg, 30),
                    f"The argument {excerpt(arg, 30)!r} is {size} bytes; at most {limits.max_arg_bytes} are accepted.",
                )
            )
            break
    if sum(sizes) > limits.max_args_bytes:
        out.append(
            Refusal(
                "too_large",
                "args",
                f"The arguments are {sum(sizes)} bytes together; at most {limits.max_args_bytes} are accepted.",
            )
        )
    if len(env) > limits.max_env:
        out.append(
            Refusal(
                "too_large",
                "env",
                f"The environment has {len(env)} variables; at most {limits.max_env} are accepted.",
            )
        )
    total = 0
    for name, value in env:
        size = len(str(value).encode("utf-8", "surrogatepass"))
        total += size + len(str(name).encode("utf-8", "surrogatepass"))
        if size > limits.max_env_value_bytes:
            out.append(
                Refusal(
                    "too_large",
                    str(name),
                    f"The environment variable {excerpt(str(name), 40)} is {size} bytes long; "
                    f"at most {limits.max_env_value_bytes} are accepted.",
                )
            )
            break
    if total > limits.max_env_bytes:
        out.append(
            Refusal(
                "too_large",
                "env",
                f"The environment is {total} bytes together; at most {limits.max_env_bytes} are accepted.",
            )
        )
    return out
