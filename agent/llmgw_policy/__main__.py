"""``python -m llmgw_policy [POLICY_FILE]``: the policy as Markdown tables,
each entry with where it was checked (docs/engine-policy.md holds them), and
its sha256, the hash the agents report."""

from __future__ import annotations

import sys
from pathlib import Path

from .kinds import plain_number
from .loading import load_policy
from .model import EnginePolicy, Policy, ValueRule


def _value(rule: ValueRule) -> str:
    if rule.kind == "choice":
        return "one of " + ", ".join(f"`{c}`" for c in rule.choices)
    if rule.kind in ("int", "float"):
        bounds = [
            f"≥ {plain_number(rule.minimum)}" if rule.minimum is not None else "",
            f"≤ {plain_number(rule.maximum)}" if rule.maximum is not None else "",
        ]
        return (
            f"{'whole number' if rule.kind == 'int' else 'number'} {' '.join(b for b in bounds if b)}".strip()
        )
    if rule.kind == "figures":
        low, high = plain_number(rule.minimum or 0), plain_number(rule.maximum or 0)
        names = ", ".join(
            f"`{k}` ({'whole number' if v == 'int' else 'number'})" for k, v in rule.keys.items()
        )
        return f"name=number pairs, each number ≥ {low} ≤ {high}, each name once, only {names}"
    if rule.kind == "json":
        return "JSON object with only " + ", ".join(
            f"`{k}` ({v.replace('_', ' ')})" for k, v in rule.keys.items()
        )
    text = {
        "switch": "no value",
        "name": "a plain name",
        "bool": "1/0, true/false",
        "token": "a token",
    }[rule.kind]
    text += " — **secret**: write-only, fingerprinted, redacted" if rule.secret else ""
    return text + ("; the engine's API key, which the agent's readiness probe sends" if rule.api_key else "")


def _across_nodes(eng: EnginePolicy) -> str:
    """The engine's rank flags for a replica across nodes, or why the agent cannot start it so."""
    group = eng.group
    if group is None:
        return "Across nodes: no rank flags in the policy, so a spec with a group is refused."
    if group.refused:
        return f"Across nodes: refused, {group.refused} ({group.source})."
    headless = f"; on every rank but 0 also `{' '.join(group.headless)}`" if group.headless else ""
    binds = "; ranks > 0 bind the serving port too" if group.ranks_bind_port else ""
    return f"Across nodes, on every rank: `{' '.join(group.args)}`{headless}{binds} ({group.source})."


def markdown(policy: Policy) -> str:
    out = [f"Policy file `agent/llmgw_policy/policy.toml`, {policy.digest}.", ""]
    limits = policy.limits
    out += [
        "Limits, the same on both sides: "
        f"{limits.max_args} arguments of at most {limits.max_arg_bytes} bytes ({limits.max_args_bytes} together), "
        f"{limits.max_env} variables of at most {limits.max_env_value_bytes} bytes ({limits.max_env_bytes} together), "
        f"a context flag of at most {limits.max_context} tokens.",
        "",
        "### Every engine",
        "",
        "| variable | value | checked in |",
        "|---|---|---|",
    ]
    out += [f"| `{name}` | {_value(rule)} | {rule.source} |" for name, rule in sorted(policy.env.items())]
    out += ["", "Refused for every engine (a `*` is a prefix):", ""]
    out += [f"- `{name}`: {why}" for name, why in {**policy.agent_env, **policy.refused_env}.items()]
    for eng in policy.engines.values():
        out += ["", f"### {eng.name} ({eng.version})", ""]
        parsing = [
            "`_` read as `-` in `--` flags" if eng.underscores_as_dashes else "no `_`/`-` folding",
            "`--flag=value` split" if eng.equals else "no `--flag=value` (write flag and value apart)",
            "argparse prefixes (refused here: exact spellings only)" if eng.abbreviations else "no prefixes",
        ]
        out += [f"Parsing: {'; '.join(parsing)}. Launch: `{' '.join(eng.launch)}`.", ""]
        out += [_across_nodes(eng), ""]
        out += ["| argument | value | checked in |", "|---|---|---|"]
        for flag, target in sorted(eng.aliases.items()):
            rule = eng.args[target]
            same = "" if flag == target else f" (same as `{target}`)"
            out.append(f"| `{flag}`{same} | {_value(rule)} | {rule.source} |")
        if eng.env:
            out += ["", "| variable | value | checked in |", "|---|---|---|"]
            out += [
                f"| `{name}` | {_value(rule)} | {rule.source} |" for name, rule in sorted(eng.env.items())
            ]
        out += ["", "Set by the launcher, never by a profile:", ""]
        out += [f"- `{flag}`: {why}" for flag, why in {**eng.owned, **eng.owned_env}.items()]
        out += ["", "Refused with a reason (anything unlisted is refused too):", ""]
        out += [f"- `{flag}`: {why}" for flag, why in {**eng.refused, **eng.refused_env}.items()]
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> int:
    policy = load_policy(Path(argv[0]) if argv else None)
    sys.stdout.write(markdown(policy))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
