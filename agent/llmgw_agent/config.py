"""The agent's configuration: a TOML file, with environment overrides.

Every problem is reported as a ``ConfigError`` naming the key (and, for an
environment override, the variable), so that an agent with a bad
configuration refuses to start instead of guessing.
"""

from __future__ import annotations

import math
import os
import stat
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ENV_PREFIX = "LLMGW_AGENT_"

# Scalar keys of the file and the variable that overrides each one.
ENV_OVERRIDES = {
    "node": "LLMGW_AGENT_NODE",
    "listen": "LLMGW_AGENT_LISTEN",
    "token": "LLMGW_AGENT_TOKEN",
    "token_file": "LLMGW_AGENT_TOKEN_FILE",
    "log_dir": "LLMGW_AGENT_LOG_DIR",
    "state_file": "LLMGW_AGENT_STATE_FILE",
    "policy_file": "LLMGW_AGENT_POLICY_FILE",
    "model_roots": "LLMGW_AGENT_MODEL_ROOTS",
    "tls_cert_file": "LLMGW_AGENT_TLS_CERT_FILE",
    "tls_key_file": "LLMGW_AGENT_TLS_KEY_FILE",
    "stop_grace_seconds": "LLMGW_AGENT_STOP_GRACE_SECONDS",
    "stop_drain_seconds": "LLMGW_AGENT_STOP_DRAIN_SECONDS",
    "ready_poll_seconds": "LLMGW_AGENT_READY_POLL_SECONDS",
    "stop_children_on_exit": "LLMGW_AGENT_STOP_CHILDREN_ON_EXIT",
    "log_attempts": "LLMGW_AGENT_LOG_ATTEMPTS",
    "log_attempt_bytes": "LLMGW_AGENT_LOG_ATTEMPT_BYTES",
}
TOP_LEVEL_KEYS = set(ENV_OVERRIDES) | {"cards", "engines", "arch"}
CARD_KEYS = {"index", "name", "memory_mib"}
# version: the release installed, declared (else read: llmgw_agent/facts.py); package: its package's
# name where it is not the usual one; python: the Python that runs it, where its command does not say.
ENGINE_KEYS = {"command", "version", "package", "python"}


class ConfigError(Exception):
    """The configuration cannot be used; the message names the key."""


@dataclass(frozen=True)
class CardConfig:
    index: int
    name: str
    memory_mib: int


@dataclass(frozen=True)
class EngineConfig:
    name: str
    command: tuple[str, ...]
    version: str = ""
    package: str = ""
    python: str = ""


@dataclass(frozen=True)
class AgentConfig:
    node: str
    host: str
    port: int
    token: str = field(repr=False)
    log_dir: Path
    state_file: Path
    policy_file: Path | None
    model_roots: tuple[str, ...]
    tls_cert_file: Path | None
    tls_key_file: Path | None
    token_file: Path | None
    stop_grace_seconds: float
    ready_poll_seconds: float
    stop_children_on_exit: bool
    cards: tuple[CardConfig, ...]
    engines: Mapping[str, EngineConfig]
    warnings: tuple[str, ...] = ()
    # How long a stop waits for a ready engine's requests in flight before SIGTERM (a DELETE's
    # ?drain= asks for another); supervisor.py, _drain.
    stop_drain_seconds: float = 30.0
    # Each start attempt's log kept (attempts.py): the first and the latest, this many in all, each
    # cut to its last log_attempt_bytes once it has ended.
    log_attempts: int = 5
    log_attempt_bytes: int = 1024 * 1024
    # The machine's architecture as declared (a stand-in node); empty: platform.machine()'s.
    arch: str = ""


def load_config(path: str | os.PathLike[str] | None, environ: Mapping[str, str] | None = None) -> AgentConfig:
    """Read the TOML file at ``path`` (or ``$LLMGW_AGENT_CONFIG``), apply the
    environment overrides, and validate everything.

    Relative paths (``log_dir``, ``state_file``, ``token_file``,
    ``policy_file``, ``tls_cert_file``, ``tls_key_file``) are taken relative to the agent's working directory,
    which is also the working directory of the engines it starts.
    """
    env = os.environ if environ is None else environ
    raw_path = path or env.get("LLMGW_AGENT_CONFIG")
    if not raw_path:
        raise ConfigError("no configuration file: pass --config PATH or set LLMGW_AGENT_CONFIG")
    config_path = Path(raw_path)
    try:
        with config_path.open("rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"configuration file {config_path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"configuration file {config_path} is not valid TOML: {exc}") from None
    return build_config(data, env)


def build_config(data: Mapping[str, Any], environ: Mapping[str, str]) -> AgentConfig:
    """Validate already-parsed TOML ``data`` with ``environ``'s overrides applied."""
    if "engines_registry" in data:
        raise ConfigError(
            "engines_registry: replaced by the launch policy the agent carries (llmgw_policy/policy.toml); "
            "remove the key, or set policy_file to another copy of the policy"
        )
    unknown = sorted(set(data) - TOP_LEVEL_KEYS)
    if unknown:
        raise ConfigError(
            f"unknown configuration key {unknown[0]!r} (known: {', '.join(sorted(TOP_LEVEL_KEYS))})"
        )
    values: dict[str, tuple[Any, str]] = {key: (data[key], key) for key in ENV_OVERRIDES if key in data}
    for key, var in ENV_OVERRIDES.items():
        if var in environ:
            values[key] = (environ[var], f"{key} (from {var})")
    warnings: list[str] = []

    node = _string(values, "node", required=True)
    host, port = _listen(values)
    token, token_file = _token(values, environ, warnings)
    log_dir = Path(_string(values, "log_dir", default=f"var/agent/{node}"))
    state_file = Path(_string(values, "state_file", default=str(log_dir / "replicas.json")))
    policy_file = _file(values, "policy_file")
    model_roots = _roots(values)
    tls_cert_file = _file(values, "tls_cert_file")
    tls_key_file = _file(values, "tls_key_file")
    if (tls_cert_file is None) != (tls_key_file is None):
        raise ConfigError("tls_cert_file and tls_key_file: give both (to serve https) or neither")

    stop_grace = _number(values, "stop_grace_seconds", default=10.0, low=0.0, high=3600.0)
    stop_drain = _number(values, "stop_drain_seconds", default=30.0, low=0.0, high=3600.0)
    ready_poll = _number(values, "ready_poll_seconds", default=0.5, low=0.05, high=60.0)
    stop_children = _boolean(values, "stop_children_on_exit", default=False)
    log_attempts = _whole(values, "log_attempts", default=5, low=1, high=100)
    log_attempt_bytes = _whole(values, "log_attempt_bytes", default=1024 * 1024, low=4096, high=2**30)

    return AgentConfig(
        node=node,
        host=host,
        port=port,
        token=token,
        log_dir=log_dir,
        state_file=state_file,
        policy_file=policy_file,
        model_roots=model_roots,
        tls_cert_file=tls_cert_file,
        tls_key_file=tls_key_file,
        token_file=token_file,
        stop_grace_seconds=stop_grace,
        stop_drain_seconds=stop_drain,
        ready_poll_seconds=ready_poll,
        stop_children_on_exit=stop_children,
        cards=_cards(data.get("cards", [])),
        engines=_engines(data.get("engines", {})),
        warnings=tuple(warnings),
        log_attempts=int(log_attempts),
        log_attempt_bytes=int(log_attempt_bytes),
        arch=_arch(data.get("arch", "")),
    )


def _arch(value: Any) -> str:
    if not isinstance(value, str) or (value and not value.strip()):
        raise ConfigError(f"arch: must be an architecture such as x86_64 or aarch64, got {value!r}")
    return value.strip()


def _string(
    values: dict[str, tuple[Any, str]], key: str, *, required: bool = False, default: str = ""
) -> str:
    if key not in values:
        if required:
            raise ConfigError(f"{key}: required, and missing")
        return default
    value, label = values[key]
    if not isinstance(value, str) or not value.strip():
        # Never echo a token back, even a malformed one.
        shown = "" if key == "token" else f", got {value!r}"
        raise ConfigError(f"{label}: must be a non-empty string{shown}")
    return value.strip()


def _file(values: dict[str, tuple[Any, str]], key: str) -> Path | None:
    text = _string(values, key, default="")
    if not text:
        return None
    path = Path(text)
    if not path.is_file():
        raise ConfigError(f"{values[key][1]}: {path} does not exist or is not a file")
    return path


def _roots(values: dict[str, tuple[Any, str]]) -> tuple[str, ...]:
    """Directories a model's source may be a path under: a list, or a
    comma-separated string (from the environment)."""
    if "model_roots" not in values:
        return ()
    value, label = values["model_roots"]
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
        raise ConfigError(f"{label}: must be a list of absolute directories, got {value!r}")
    roots = tuple(i.strip().rstrip("/") or "/" for i in items if i.strip())
    for root in roots:
        if not root.startswith("/"):
            raise ConfigError(f"{label}: {root!r} is not an absolute directory")
    return roots


def _whole(values: dict[str, tuple[Any, str]], key: str, *, default: int, low: int, high: int) -> int:
    """A whole number from ``low`` to ``high`` (a count, a size in bytes)."""
    if key not in values:
        return default
    value, label = values[key]
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(f"{label}: must be a whole number from {low} to {high}, got {value!r}")
    return value


def _number(
    values: dict[str, tuple[Any, str]], key: str, *, default: float, low: float, high: float
) -> float:
    if key not in values:
        return default
    value, label = values[key]
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise ConfigError(f"{label}: must be a number of seconds, got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(f"{label}: must be a number of seconds, got {value!r}")
    if not low <= value <= high:
        raise ConfigError(f"{label}: must be between {low:g} and {high:g} seconds, got {value:g}")
    return float(value)


def _boolean(values: dict[str, tuple[Any, str]], key: str, *, default: bool) -> bool:
    if key not in values:
        return default
    value, label = values[key]
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in {
        "1",
        "true",
        "yes",
        "on",
        "0",
        "false",
        "no",
        "off",
    }:
        return value.strip().lower() in {"1", "true", "yes", "on"}
    raise ConfigError(f"{label}: must be true or false, got {value!r}")


def _listen(values: dict[str, tuple[Any, str]]) -> tuple[str, int]:
    listen = _string(values, "listen", default="127.0.0.1:9101")
    label = values["listen"][1] if "listen" in values else "listen"
    host, sep, port_text = listen.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ConfigError(f"{label}: must be HOST:PORT (for example 127.0.0.1:9101), got {listen!r}")
    return host, int(port_text)


def _token(
    values: dict[str, tuple[Any, str]], environ: Mapping[str, str], warnings: list[str]
) -> tuple[str, Path | None]:
    """The token, and the file it came from (where a rotated token is written), if any."""
    # The environment beats the file; inside the file, one way only, so that
    # nobody has to wonder which of two tokens is in force.
    if ENV_OVERRIDES["token"] in environ:
        source = "token"
    elif ENV_OVERRIDES["token_file"] in environ:
        source = "token_file"
    elif "token" in values and "token_file" in values:
        raise ConfigError("token and token_file: set one of them, not both")
    elif "token" in values:
        source = "token"
    elif "token_file" in values:
        source = "token_file"
    else:
        raise ConfigError(
            "token: required (token, token_file or LLMGW_AGENT_TOKEN); refusing to start without one"
        )
    if source == "token":
        return _string(values, "token"), None
    token_path = Path(_string(values, "token_file"))
    label = values["token_file"][1]
    try:
        token = token_path.read_text(encoding="utf-8").strip()
        mode = token_path.stat().st_mode
    except OSError as exc:
        raise ConfigError(f"{label}: cannot read {token_path}: {exc.strerror}") from None
    if not token:
        raise ConfigError(f"{label}: {token_path} is empty; refusing to start without a token")
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        warnings.append(f"token_file {token_path} can be read by other users; chmod 600 it")
    return token, token_path


def _cards(raw: Any) -> tuple[CardConfig, ...]:
    if not isinstance(raw, list):
        raise ConfigError("cards: must be an array of tables ([[cards]])")
    cards: list[CardConfig] = []
    for n, entry in enumerate(raw):
        where = f"cards[{n}]"
        if not isinstance(entry, dict):
            raise ConfigError(f"{where}: must be a table with index, name and memory_mib")
        unknown = sorted(set(entry) - CARD_KEYS)
        if unknown:
            raise ConfigError(f"{where}.{unknown[0]}: unknown key (known: index, name, memory_mib)")
        for key in sorted(CARD_KEYS - set(entry)):
            raise ConfigError(f"{where}.{key}: required, and missing")
        index, name, memory = entry["index"], entry["name"], entry["memory_mib"]
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise ConfigError(f"{where}.index: must be a whole number 0 or more, got {index!r}")
        if not isinstance(name, str) or not name.strip():
            raise ConfigError(f"{where}.name: must be a non-empty string, got {name!r}")
        if isinstance(memory, bool) or not isinstance(memory, int) or memory <= 0:
            raise ConfigError(f"{where}.memory_mib: must be a whole number of MiB above 0, got {memory!r}")
        if any(card.index == index for card in cards):
            raise ConfigError(f"{where}.index: card {index} is listed twice")
        cards.append(CardConfig(index=index, name=name.strip(), memory_mib=memory))
    return tuple(sorted(cards, key=lambda card: card.index))


def _engines(raw: Any) -> dict[str, EngineConfig]:
    if not isinstance(raw, dict):
        raise ConfigError("engines: must be a table of engines ([engines.NAME] with command = [...])")
    engines: dict[str, EngineConfig] = {}
    for name, entry in raw.items():
        where = f"engines.{name}"
        if not isinstance(entry, dict):
            raise ConfigError(f"{where}: must be a table with command = [...]")
        unknown = sorted(set(entry) - ENGINE_KEYS)
        if unknown:
            raise ConfigError(f"{where}.{unknown[0]}: unknown key (known: {', '.join(sorted(ENGINE_KEYS))})")
        command = entry.get("command")
        if (
            not isinstance(command, list)
            or not command
            or not all(isinstance(part, str) and part and "\0" not in part for part in command)
        ):
            raise ConfigError(
                f"{where}.command: must be a non-empty array of non-empty strings, got {command!r}"
            )
        texts = {}
        for key in ("version", "package", "python"):
            value = entry.get(key, "")
            if not isinstance(value, str) or (key in entry and not value.strip()):
                raise ConfigError(f"{where}.{key}: must be a non-empty string, got {value!r}")
            texts[key] = value.strip()
        engines[name] = EngineConfig(name=name, command=tuple(command), **texts)
    if not engines:
        raise ConfigError("engines: at least one engine is required ([engines.NAME] with command = [...])")
    return engines
