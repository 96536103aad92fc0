"""A whole spec, as the agent receives it: the launcher's own arguments (the
engine's launch template filled in, the revision, the TP width) and then a
profile's, which ``check_profile`` checks."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

from .group import GroupSpec, check_group_part, group_args
from .model import PLACEHOLDER, EnginePolicy, Policy, PolicyError, Refusal, excerpt
from .profile import check_profile
from .source import source_refusal, split_source


def launch_args(
    policy: Policy,
    engine: str,
    *,
    source: str,
    port: int,
    model: str,
    tp: int,
    args: Sequence[str],
    group: GroupSpec | None = None,
) -> list[str]:
    """The arguments a replica starts with (after the agent's program): the
    engine's launch template filled in, the revision when the source pins
    one, the TP width for a tensor-parallel engine, the rank flags of a
    replica across nodes (``group_args``; ``PolicyError`` for an engine that
    cannot span nodes or a group that is wrong), then the profile's own."""
    eng = policy.engines[engine]
    repo, revision = split_source(source)
    values = {"{source}": repo, "{port}": str(port), "{model}": model}
    out = [PLACEHOLDER.sub(lambda m: values[m[0]], token) for token in eng.launch]
    if revision is not None and eng.revision_flag:
        out += [eng.revision_flag, revision]
    if eng.tp_flag:
        out += [eng.tp_flag, str(tp)]
    if group is not None:
        problem = group.problem()
        if problem is not None:  # what the agent would refuse, said before a spec is sent
            raise PolicyError(f"The replica's group is wrong: {problem}.")
        out += group_args(eng, group.rank, group.size, group.address, group.port)
    return [*out, *args]


def check_spec(
    policy: Policy,
    engine: str,
    args: Sequence[str],
    env: Mapping[str, str] | Iterable[tuple[str, str]],
    *,
    port: int,
    model: str,
    roots: Sequence[str] = (),
    group: GroupSpec | None = None,
) -> list[Refusal]:
    """Every reason the agent may not start this spec: its arguments must
    begin with the engine's launch template naming the spec's own port and
    model and a checked source (then the revision and TP width the launcher
    writes, and for a rank of a replica across nodes exactly the rank flags
    ``group_args`` makes of ``group``), and what follows is checked as a
    profile's arguments, where every rank flag is refused (the policy lists
    them as the launcher's own)."""
    eng = policy.engines.get(engine)
    if eng is None:
        return check_profile(policy, engine, args, env)
    own, refusal = _launcher_part(eng, args, port=port, model=model, roots=roots)
    if refusal is None and group is not None:
        own, refusal = check_group_part(eng, args, own, group)
    if refusal is not None:
        return [refusal]
    return check_profile(policy, engine, args[own:], env)


def _launcher_part(
    eng: EnginePolicy, args: Sequence[str], *, port: int, model: str, roots: Sequence[str]
) -> tuple[int, Refusal | None]:
    def mismatch(sentence: str) -> tuple[int, Refusal]:
        return 0, Refusal("launch_mismatch", "args", sentence)

    template = eng.launch
    if len(args) < len(template):
        return mismatch(
            f"The arguments must begin with the launcher's own for {eng.name} "
            f"({' '.join(template)}), and they are shorter."
        )
    values: dict[str, str] = {}
    for pattern, token in zip(template, args, strict=False):
        match = re.fullmatch(_template_regex(pattern), token)
        if match is None:
            return mismatch(
                f"The arguments must begin with the launcher's own for {eng.name} "
                f"({' '.join(template)}); {excerpt(token)!r} is not {pattern}."
            )
        values.update(match.groupdict())
    if values.get("port") != str(port):
        return mismatch(
            f"The launch arguments give port {values.get('port')}, but the spec's port is {port}."
        )
    if values.get("model") != model:
        return mismatch(
            f"The launch arguments serve the model as {values.get('model')!r}, but the spec's model is {model!r}."
        )
    source = values.get("source", "")
    i = len(template)
    if eng.revision_flag and i + 1 < len(args) and args[i] == eng.revision_flag:
        source = f"{source}@{args[i + 1]}"
        i += 2
    bad_source = source_refusal(source, roots)
    if bad_source is not None:
        return 0, bad_source
    if eng.tp_flag:
        if i + 1 >= len(args) or args[i] != eng.tp_flag or not re.fullmatch(r"[1-9]\d{0,2}", args[i + 1]):
            return mismatch(
                f"After the launch arguments the launcher writes {eng.tp_flag} and the width; "
                "they are missing or not a whole number from 1 to 999."
            )
        i += 2
    return i, None


def _template_regex(pattern: str) -> str:
    parts, seen, pos = [], set(), 0
    for match in PLACEHOLDER.finditer(pattern):
        parts.append(re.escape(pattern[pos : match.start()]))
        parts.append(f"(?P={match[1]})" if match[1] in seen else f"(?P<{match[1]}>.+)")
        seen.add(match[1])
        pos = match.end()
    parts.append(re.escape(pattern[pos:]))
    return "".join(parts)
