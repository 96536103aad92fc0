"""A profile's environment against the policy: each variable's name, whether
the node agent or the launcher owns it, whether it is refused (a ``*`` in a
name is a prefix) or listed, and its value by the listed kind."""

from __future__ import annotations

from collections.abc import Mapping

from .kinds import value_problem
from .model import HOW_TO_ADD, EnginePolicy, Policy, Refusal, excerpt
from .tokens import ENV_NAME


def _prefixed(table: Mapping[str, str], name: str) -> str | None:
    if name in table:
        return table[name]
    for key, why in table.items():
        if key.endswith("*") and name.startswith(key[:-1]):
            return why
    return None


def check_env(policy: Policy, eng: EnginePolicy, env: list[tuple[str, str]]) -> list[Refusal]:
    """Every reason a variable of ``env`` may not be set for ``eng``, in order."""
    out = []
    for name, value in env:
        if not isinstance(name, str) or not ENV_NAME.fullmatch(name):
            out.append(
                Refusal(
                    "refused_env",
                    excerpt(str(name)),
                    f"{excerpt(str(name))!r} is not an environment variable name: use letters, digits and '_'.",
                )
            )
            continue
        if not isinstance(value, str):
            out.append(
                Refusal("refused_env", name, f"The environment variable {name} must have a string value.")
            )
            continue
        if name in policy.agent_env:
            out.append(
                Refusal(
                    "refused_env",
                    name,
                    f"{name} is set by the node agent, not by a profile: {policy.agent_env[name]}.",
                )
            )
            continue
        why = _prefixed(eng.owned_env, name)
        if why is not None:
            out.append(
                Refusal(
                    "refused_env",
                    name,
                    f"The environment variable {name} is refused for {eng.name}: the launcher sets it, not a profile ({why}).",
                )
            )
            continue
        why = _prefixed(eng.refused_env, name)
        if why is None and name not in eng.env:
            why = _prefixed(policy.refused_env, name)
        if why is not None:
            out.append(
                Refusal(
                    "refused_env", name, f"The environment variable {name} is refused for {eng.name}: {why}."
                )
            )
            continue
        rule = eng.env.get(name) or policy.env.get(name)
        if rule is None:
            out.append(
                Refusal(
                    "refused_env",
                    name,
                    f"The environment variable {name} is not on {eng.name}'s list of variables a profile "
                    f"may set; an operator who has checked that it names no path, host or code can add "
                    f"it under [engines.{eng.name}.env] in the launch policy ({HOW_TO_ADD}).",
                )
            )
            continue
        if "\0" in value:
            out.append(
                Refusal("refused_env", name, f"The environment variable {name} holds a NUL character.")
            )
            continue
        problem = value_problem(rule, value)
        if problem:
            shown = "(secret)" if rule.secret else repr(excerpt(value))
            out.append(
                Refusal(
                    "refused_env",
                    name,
                    f"The environment variable {name} is refused for {eng.name}: its value {shown} {problem}.",
                )
            )
    return out
