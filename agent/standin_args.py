"""The stand-in engine's own flags and variables (a flag wins over its variable), parsed for
standin_engine.py, beside it: every other argument passes through, as a real engine's flags reach
it unchanged.

Parsed by hand, not by argparse, with argparse's behaviour (names in full, ``--flag value`` or
``--flag=value``, exit status 2 with its sentences): argparse's import and parser cost a
stand-in's start 12 ms of CPU, sixteen times over when a fleet's wave of replacements starts on the
machine that a benchmark measures (docs/benchmarks.md).
"""

from __future__ import annotations

import os
import sys

# Not typing's own: importing typing costs a stand-in's start 2 ms of its CPU (mypy reads the name).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


def _env_float(name: str, default: float | None) -> float | None:
    raw = os.environ.get(name, "").strip()
    return float(raw) if raw else default


class Args:
    """The stand-in's flags, each from its flag, else its variable, else its default
    (``parse_args``); the rest of its argv passes through."""

    def __init__(self, given: dict[str, Any]):
        self.host: str = given.get("host", "127.0.0.1")
        port = given.get("port")
        if port is None:
            port = os.environ.get("LLMGW_REPLICA_PORT", "").strip()
            if not port.isdigit():
                raise usage_error("no port: pass --port or set LLMGW_REPLICA_PORT")
        self.port = int(port)
        self.served_model_name: str = given.get(
            "served_model_name", os.environ.get("LLMGW_SERVED_MODEL", "").strip() or "standin"
        )
        loads = given.get("load_seconds", _env_float("STANDIN_LOAD_SECONDS", 2.0))
        self.load_seconds: float = 2.0 if loads is None else loads
        self.never_ready: bool = given.get("never_ready", _env_flag("STANDIN_NEVER_READY"))
        self.exit_at_start: int | None = given.get("exit_at_start")
        if self.exit_at_start is None and os.environ.get("STANDIN_EXIT_AT_START", "").strip():
            self.exit_at_start = int(os.environ["STANDIN_EXIT_AT_START"])
        self.crash_after: float | None = given.get("crash_after", _env_float("STANDIN_CRASH_AFTER", None))
        self.ignore_sigterm: bool = given.get("ignore_sigterm", _env_flag("STANDIN_IGNORE_SIGTERM"))
        self.generation_fails: bool = given.get("generation_fails", _env_flag("STANDIN_GENERATION_FAILS"))
        # The engine and release whose start-up memory lines it prints (agent/standin_memory.py).
        self.play: str = given.get("play", "standin")
        self.play_release: str | None = given.get("play_release")


# Each flag: the attribute it sets and what its value is (None: a switch, taking no value).
FLAGS: dict[str, tuple[str, type | None]] = {
    "--host": ("host", str),
    "--port": ("port", int),
    "--served-model-name": ("served_model_name", str),
    "--alias": ("served_model_name", str),
    "--load-seconds": ("load_seconds", float),
    "--never-ready": ("never_ready", None),
    "--exit-at-start": ("exit_at_start", int),
    "--crash-after": ("crash_after", float),
    "--ignore-sigterm": ("ignore_sigterm", None),
    "--generation-fails": ("generation_fails", None),
    "--play": ("play", str),
    "--play-release": ("play_release", str),
}


def usage_error(message: str) -> SystemExit:
    """What argparse's ``error`` does: the message on stderr, exit status 2."""
    print(f"standin_engine.py: error: {message}", file=sys.stderr, flush=True)
    return SystemExit(2)


def parse_args(argv: list[str]) -> tuple[Args, list[str]]:
    """The stand-in's flags (``--flag value`` or ``--flag=value``, names in full) and the arguments
    it does not know, in their order: a real engine's flags pass through."""
    given: dict[str, Any] = {}
    unknown: list[str] = []
    i = 0
    while i < len(argv):
        name, equals, value = argv[i].partition("=")
        known = FLAGS.get(name) if name.startswith("--") else None
        i += 1
        if known is None:
            unknown.append(argv[i - 1])
            continue
        attribute, kind = known
        if kind is None:
            if equals:
                raise usage_error(f"argument {name}: ignored explicit argument {value!r}")
            given[attribute] = True
            continue
        if not equals:
            if i >= len(argv) or argv[i].startswith("--"):
                raise usage_error(f"argument {name}: expected one argument")
            value, i = argv[i], i + 1
        try:
            given[attribute] = kind(value)
        except ValueError:
            raise usage_error(f"argument {name}: invalid {kind.__name__} value: {value!r}") from None

    return Args(given), unknown
