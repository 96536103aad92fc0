"""What a replica spec may not contain: the engine registry's refusals, and the
agent's own.

The engine registry (``catalog/planning/engines.toml``, kept with the catalog)
lists per engine the arguments and environment variables that make an engine
read files, fetch from the network or load code. The control plane refuses
them when a profile is saved; the agent refuses them again at the last moment,
because it is what actually runs the process and a caller may bypass the
control plane. The rules follow ``catalog/planning/engines.py`` (which the
agent cannot import: it runs on GPU nodes with the standard library only):

- top-level tables are engines; top-level ``refused_env_everywhere`` applies to
  every engine and ``reserved_env`` (variables the agent sets) too;
- per engine: ``refused_args`` (refused as ``--flag value`` and
  ``--flag=value``), ``refused_env``, ``refused_env_prefixes``;
  ``underscores_as_dashes`` (the parser reads ``--a_b`` as ``--a-b``) and
  ``abbreviations`` (argparse: a proper prefix of a long flag is that flag);
- ``launch``: the arguments the control plane itself puts first
  (``{source}``, ``{port}``, ``{model}`` filled in). Some of them are refused
  for profiles (FreeToken's ``--model``, llama.cpp's ``-m``), so when a spec's
  arguments begin with the filled-in template, refusals apply to what follows,
  and the template's port and model must be the spec's.

Other keys (memory model, TP spellings, ...) are the planner's and are ignored.
"""

from __future__ import annotations

import os
import re
import threading
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

READS = "flags that read files, fetch from the network or load code are not passed to an engine"
ENV_READS = "variables that name paths, other hosts or code to load are not passed to an engine"

# Never settable through a spec, whatever the registry says: the agent decides
# which cards a replica sees and in which order (PCI bus order, the order
# nvidia-smi numbers them in), and its LLMGW_ variables are its own.
AGENT_ENV = {
    "CUDA_VISIBLE_DEVICES": "the agent sets it from the replica's cards",
    "CUDA_DEVICE_ORDER": "the agent sets it to PCI_BUS_ID so that card indices are nvidia-smi's",
}
AGENT_ENV_PREFIX = "LLMGW_"

_NUMBER = re.compile(r"-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")
_PLACEHOLDER = re.compile(r"\{(source|port|model)\}")


class RegistryError(Exception):
    """The registry file cannot be read or does not have the expected shape."""


@dataclass(frozen=True)
class EngineRules:
    engine: str
    refused_args: tuple[str, ...] = ()
    refused_env: tuple[str, ...] = ()
    refused_env_prefixes: tuple[str, ...] = ()
    reserved_env: tuple[str, ...] = ()
    underscores_as_dashes: bool = False
    abbreviations: bool = False
    launch: tuple[str, ...] = ()


@dataclass(frozen=True)
class Refusal:
    code: str  # refused_arg, refused_env or launch_mismatch
    sentence: str


def parse_registry(data: Mapping[str, Any]) -> dict[str, EngineRules]:
    """Each engine's rules, from the parsed TOML of the engine registry."""
    everywhere = _strings(data.get("refused_env_everywhere", []), "refused_env_everywhere")
    reserved = _strings(data.get("reserved_env", []), "reserved_env")
    engines = {}
    for name, table in data.items():
        if not isinstance(table, dict):
            continue
        flags = {key: table.get(key, False) for key in ("underscores_as_dashes", "abbreviations")}
        for key, value in flags.items():
            if not isinstance(value, bool):
                raise RegistryError(f"engine {name!r}, key {key!r}: must be true or false")
        prefixes = _strings(table.get("refused_env_prefixes", []), f"{name}.refused_env_prefixes")
        if any(not prefix for prefix in prefixes):
            raise RegistryError(
                f"engine {name!r}, key 'refused_env_prefixes': an empty prefix refuses everything"
            )
        engines[name] = EngineRules(
            engine=name,
            refused_args=_strings(table.get("refused_args", []), f"{name}.refused_args"),
            refused_env=tuple(
                dict.fromkeys((*_strings(table.get("refused_env", []), f"{name}.refused_env"), *everywhere))
            ),
            refused_env_prefixes=prefixes,
            reserved_env=reserved,
            underscores_as_dashes=flags["underscores_as_dashes"],
            abbreviations=flags["abbreviations"],
            launch=_strings(table.get("launch", []), f"{name}.launch"),
        )
    if not engines:
        raise RegistryError("no engine tables")
    return engines


def load_registry(path: Path) -> dict[str, EngineRules]:
    try:
        with path.open("rb") as fh:
            data = tomllib.load(fh)
    except OSError as exc:
        raise RegistryError(f"{path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise RegistryError(f"{path} is not valid TOML: {exc}") from None
    try:
        return parse_registry(data)
    except RegistryError as exc:
        raise RegistryError(f"{path}: {exc}") from None


class RegistryFile:
    """The registry at ``path``, re-read whenever its modification time or size
    changes. A registry that cannot be read refuses every start (fail closed)."""

    def __init__(self, path: Path):
        self.path = path
        self._lock = threading.Lock()
        self._stamp: tuple[int, int] | None = None
        self._engines: dict[str, EngineRules] = {}
        self.current()  # an unusable registry stops the agent at startup

    def current(self) -> dict[str, EngineRules]:
        with self._lock:
            try:
                st = os.stat(self.path)
            except OSError as exc:
                raise RegistryError(f"{self.path}: {exc.strerror}") from None
            stamp = (st.st_mtime_ns, st.st_size)
            if stamp != self._stamp:
                self._engines = load_registry(self.path)
                self._stamp = stamp
            return self._engines


def refusal(
    engine: str, args: Sequence[str], env: Iterable[str], rules: EngineRules | None, *, port: int, model: str
) -> Refusal | None:
    """Why a spec cannot run, or None. ``rules`` is None for an engine the
    registry does not know (or no registry): then only the agent's own
    variables are refused."""
    for name in env:
        if name in AGENT_ENV:
            return Refusal(
                "refused_env", f"Environment variable {name} cannot be set in a spec: {AGENT_ENV[name]}."
            )
        if name.startswith(AGENT_ENV_PREFIX):
            return Refusal(
                "refused_env",
                f"Environment variable {name} cannot be set in a spec: {AGENT_ENV_PREFIX}* are the agent's own.",
            )
        if rules is None:
            continue
        if name in rules.reserved_env:
            return Refusal(
                "refused_env",
                f"Environment variable {name} cannot be set in a spec: the agent sets it from the cards.",
            )
        prefix = next((p for p in rules.refused_env_prefixes if name.startswith(p)), None)
        if name in rules.refused_env or prefix:
            which = f" (variables starting with {prefix})" if prefix and name not in rules.refused_env else ""
            return Refusal(
                "refused_env",
                f"Environment variable {name}{which} is refused for engine {engine}: {ENV_READS}.",
            )
    if rules is None:
        return None
    own, mismatch = _launch_prefix(rules, args, port=port, model=model)
    if mismatch:
        return Refusal("launch_mismatch", mismatch)
    for token in args[own:]:
        if not _is_flag(token):
            continue
        name = token.split("=", 1)[0]
        target = _spelling_of(rules, name)
        if target is None:
            continue
        read_as = "" if target == name else f" (read as {target})"
        return Refusal("refused_arg", f"Argument {name}{read_as} is refused for engine {engine}: {READS}.")
    return None


def _launch_prefix(rules: EngineRules, args: Sequence[str], *, port: int, model: str) -> tuple[int, str]:
    """How many leading ``args`` are the control plane's filled-in ``launch``
    template (0 when they are not), and a sentence when its port or model is
    not the spec's."""
    template = rules.launch
    if not template or len(args) < len(template):
        return 0, ""
    values: dict[str, str] = {}
    for pattern, token in zip(template, args, strict=False):
        match = re.fullmatch(_template_regex(pattern), token)
        if match is None:
            return 0, ""
        for key, value in match.groupdict().items():
            # A filled-in value is a path, a number or a name, never a flag:
            # otherwise "{source}" would let any refused flag through.
            if _is_flag(value):
                return 0, ""
            values[key] = value
    if "port" in values and values["port"] != str(port):
        return 0, f"The launch arguments give port {values['port']}, but the spec's port is {port}."
    if "model" in values and values["model"] != model:
        return (
            0,
            f"The launch arguments serve the model as {values['model']!r}, but the spec's model is {model!r}.",
        )
    return len(template), ""


def _template_regex(pattern: str) -> str:
    """A regular expression for one token of the ``launch`` template."""
    parts, seen, pos = [], set(), 0
    for match in _PLACEHOLDER.finditer(pattern):
        parts.append(re.escape(pattern[pos : match.start()]))
        parts.append(f"(?P={match[1]})" if match[1] in seen else f"(?P<{match[1]}>.*)")
        seen.add(match[1])
        pos = match.end()
    parts.append(re.escape(pattern[pos:]))
    return "".join(parts)


def _is_flag(token: str) -> bool:
    return len(token) > 1 and token.startswith("-") and not _NUMBER.fullmatch(token)


def _canonical(rules: EngineRules, name: str) -> str:
    if rules.underscores_as_dashes and name.startswith("--"):
        return "--" + name[2:].replace("_", "-")
    return name


def _spelling_of(rules: EngineRules, name: str) -> str | None:
    """The refused flag the engine's parser would read ``name`` as, or None."""
    refused = {_canonical(rules, flag): flag for flag in rules.refused_args}
    mine = _canonical(rules, name)
    if mine in refused:
        return refused[mine]
    if rules.abbreviations and mine.startswith("--") and len(mine) > 2:
        for flag, original in refused.items():
            if flag.startswith("--") and flag.startswith(mine):
                return original
    return None


def _strings(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise RegistryError(f"{where}: must be a list of strings")
    return tuple(value)
