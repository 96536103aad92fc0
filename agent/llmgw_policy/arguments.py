"""A profile's arguments against its engine's entry: each token read as the
engine's parser reads it (``parsing``), then refused or checked by the value
kind of the flag it is listed under (``kinds``). Only the exact spellings
listed pass; anything else (an abbreviation, a dotted vLLM key, a positional
token, a value that looks like a flag) is refused with a sentence that says
which argument and why."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .kinds import value_problem
from .model import HOW_TO_ADD, EnginePolicy, Refusal, ValueRule, excerpt
from .parsing import abbreviates, lookup, skip_value, split_flag
from .tokens import is_flag, parse_int


@dataclass(frozen=True)
class ContextRule:
    """How the engine's context flag may appear: at all (``allowed``: the
    context operation wrote it), at most ``model_max`` tokens when the model's
    length is known, never above the policy's ``policy_max``."""

    allowed: bool
    model_max: int | None
    policy_max: int


def check_args(eng: EnginePolicy, args: Sequence[str], context: ContextRule) -> list[Refusal]:
    """Every reason ``args`` may not be passed to ``eng``, in order; empty when they may."""
    out: list[Refusal] = []
    seen_context = 0
    i = 0
    while i < len(args):
        token = args[i]
        i += 1
        refusal = _not_a_flag(eng, token)
        if refusal is None and "=" in token and not eng.equals:
            refusal = _joined_unsplit(eng, token)
        if refusal is not None:
            out.append(refusal)
            continue
        written, joined_value = split_flag(eng, token)
        canon = eng.canonical(written)
        if canon in eng.context_flags and context.allowed:
            seen_context += 1
            refusal, i = _context_flag(eng, args, i, written, joined_value, context, twice=seen_context > 1)
        else:
            refusal, i = _flag(eng, args, i, written, joined_value)
        if refusal is not None:
            out.append(refusal)
    return out


def _refused_for(eng: EnginePolicy, written: str) -> str:
    """The head of a flag's refusal: the flag, the engine, and how its parser reads it."""
    canon = eng.canonical(written)
    read = "" if canon == written else f" (read as {canon})"
    return f"{written} is refused for {eng.name}{read}"


def _not_a_flag(eng: EnginePolicy, token: str) -> Refusal | None:
    """A token that cannot be a flag at all: not a string, control characters,
    or a positional token."""
    if not isinstance(token, str):
        return Refusal("refused_arg", repr(token), "Every argument must be a string.")
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in token):
        return Refusal(
            "refused_arg",
            excerpt(token),
            f"The argument {excerpt(token)!r} holds control characters.",
        )
    if not is_flag(token):
        return Refusal(
            "refused_arg",
            excerpt(token),
            f"{excerpt(token)!r} is not an argument a profile may pass to {eng.name}: it is not "
            "a listed flag nor the value of one (the launcher gives the model; every other "
            "argument is a flag from the engine's list).",
        )
    return None


def _joined_unsplit(eng: EnginePolicy, token: str) -> Refusal:
    """``--flag=value`` for a parser that does not split it."""
    written = token.split("=", 1)[0]
    head = eng.canonical(written)
    known = lookup(eng, eng.refused, head) or lookup(eng, eng.owned, head)
    if known is not None:
        # The engine would not read it, but it says what was meant: name that.
        how = "" if head == written else f" (read as {head})"
        why = (
            known[1]
            if known[1] in eng.refused.values()
            else f"the launcher sets it, not a profile ({known[1]})"
        )
        return Refusal("refused_arg", written, f"{written} is refused for {eng.name}{how}: {why}.")
    return Refusal(
        "refused_arg",
        excerpt(token),
        f"{excerpt(token)} is refused for {eng.name}: its parser does not split "
        f"--flag=value (it would read the whole token as a flag); write {head} and its "
        "value as two arguments.",
    )


def _context_flag(
    eng: EnginePolicy,
    args: Sequence[str],
    i: int,
    written: str,
    joined_value: str | None,
    context: ContextRule,
    *,
    twice: bool,
) -> tuple[Refusal | None, int]:
    """The context flag, which the context operation writes once: its value
    (taken from the next token when not joined), and where reading goes on."""
    value = joined_value
    if value is None:
        value = args[i] if i < len(args) else None
        i += 1
    problem = _context_problem(value, context, twice=twice)
    if problem is None:
        return None, i
    return Refusal(
        "refused_arg",
        written,
        f"{_refused_for(eng, written)}: the context flag {problem}; it is set by the context operation.",
    ), i


def _context_problem(value: str | None, context: ContextRule, *, twice: bool) -> str | None:
    tokens = None if value is None or is_flag(value) else parse_int(value)
    if tokens is None:
        return "needs a whole number of tokens"
    if tokens < 1:
        return "must be at least 1"
    if context.model_max is not None and tokens > context.model_max:
        return f"is above the model's context length, {context.model_max} tokens"
    if tokens > context.policy_max:
        return f"is above the longest context the launch policy allows, {context.policy_max} tokens"
    if twice:
        return "is given twice; the context operation writes it once"
    return None


def _flag(
    eng: EnginePolicy, args: Sequence[str], i: int, written: str, joined_value: str | None
) -> tuple[Refusal | None, int]:
    """Any flag but the context flag: owned by the launcher, refused, not
    listed, or listed and its value checked; and where reading goes on."""
    canon = eng.canonical(written)
    refused_for = _refused_for(eng, written)
    owned = lookup(eng, eng.owned, canon)
    if owned is not None:
        why = owned[1]
        refusal = Refusal(
            "refused_arg", written, f"{refused_for}: the launcher sets it, not a profile ({why})."
        )
        return refusal, skip_value(args, i, joined_value)
    refused = lookup(eng, eng.refused, canon)
    if refused is not None:
        return Refusal("refused_arg", written, f"{refused_for}: {refused[1]}."), skip_value(
            args, i, joined_value
        )
    target = eng.aliases.get(canon)
    if target is None:
        return _not_listed(eng, written, canon, refused_for), skip_value(args, i, joined_value)
    return _listed(eng.args[target], args, i, written, joined_value, refused_for, equals=eng.equals)


def _listed(
    rule: ValueRule,
    args: Sequence[str],
    i: int,
    written: str,
    joined_value: str | None,
    refused_for: str,
    *,
    equals: bool,
) -> tuple[Refusal | None, int]:
    """A listed flag: a switch takes no value; any other takes one (joined, or
    the next token when that is not a flag) of its rule's kind. A missing
    value's refusal names a choice's values, and offers ``--flag=VALUE`` only
    to an engine whose parser splits it."""
    if rule.kind == "switch":
        if joined_value is not None:
            return Refusal("refused_arg", written, f"{refused_for}: it takes no value, but was given one."), i
        return None, i
    which = f" (one of {', '.join(rule.choices)})" if rule.kind == "choice" else ""
    value = joined_value
    if value is None:
        if i >= len(args):
            return Refusal(
                "refused_arg", written, f"{refused_for}: it needs a value{which}, and none follows."
            ), i
        value = args[i]
        i += 1
        if is_flag(value):
            fix = f"write {written}=VALUE or give it a value" if equals else "give it a value"
            return Refusal(
                "refused_arg",
                written,
                f"{refused_for}: its value {excerpt(value)!r} looks like a flag; {fix}{which}.",
            ), i
    problem = value_problem(rule, value)
    if problem:
        return Refusal("refused_arg", written, f"{refused_for}: its value {excerpt(value)!r} {problem}."), i
    return None, i


def _not_listed(eng: EnginePolicy, written: str, canon: str, refused_for: str) -> Refusal:
    if eng.name == "vllm" and "." in canon and canon.startswith("--"):
        head = canon.split(".", 1)[0]
        return Refusal(
            "refused_arg",
            written,
            f"{refused_for}: vLLM reads it as a key of {head}'s JSON; give {head} a JSON "
            "object with the keys the policy lists, if it lists the flag.",
        )
    prefix_of = abbreviates(eng, canon)
    if prefix_of is not None:
        why = eng.owned.get(prefix_of) or eng.refused.get(prefix_of)
        return Refusal(
            "refused_arg",
            written,
            f"{refused_for}: its parser reads it as {prefix_of}, and {why}.",
        )
    listed = [flag for flag in eng.aliases if flag.startswith("--") and eng.canonical(flag).startswith(canon)]
    hint = f" (write it in full: {', '.join(listed[:3])})" if listed and canon.startswith("--") else ""
    return Refusal(
        "refused_arg",
        written,
        f"{refused_for}: it is not on {eng.name}'s list of arguments a profile may pass{hint}; "
        f"an operator who has checked in {eng.name}'s own parser that it reads no files, fetches "
        f"nothing and loads no code can add it under [engines.{eng.name}.args] in the launch policy "
        f"({HOW_TO_ADD}).",
    )
