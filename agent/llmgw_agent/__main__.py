"""``python -m llmgw_agent --config agent.toml``: run the node agent until
SIGTERM or SIGINT."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading

from . import __version__
from .cards import discover_cards
from .config import ConfigError, load_config
from .registry import RegistryError, RegistryFile
from .server import AgentServer
from .supervisor import Supervisor

log = logging.getLogger("llmgw_agent")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m llmgw_agent",
        description="The llmgw node agent: starts, watches and stops model replicas on this node.",
    )
    parser.add_argument("--config", help="the agent's TOML configuration (default: $LLMGW_AGENT_CONFIG)")
    parser.add_argument(
        "--stop-children-on-exit",
        action="store_true",
        help="stop every replica when the agent exits (tests and demos; by default replicas keep serving "
        "and the next agent run adopts them)",
    )
    parser.add_argument("--version", action="version", version=f"llmgw-agent {__version__}")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )

    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"llmgw-agent: configuration error: {exc}", file=sys.stderr)
        return 2
    # Nothing this process starts (nvidia-smi, engines) should inherit it.
    os.environ.pop("LLMGW_AGENT_TOKEN", None)
    for warning in config.warnings:
        log.warning("%s", warning)

    registry = None
    if config.engines_registry is not None:
        try:
            registry = RegistryFile(config.engines_registry)
        except RegistryError as exc:
            print(f"llmgw-agent: configuration error: engines_registry: {exc}", file=sys.stderr)
            return 2
        missing = sorted(set(config.engines) - set(registry.current()))
        if missing:
            log.warning(
                "engines %s are not in the engine registry %s: replicas of them will be refused",
                ", ".join(missing),
                config.engines_registry,
            )

    cards, cards_source = discover_cards(config.cards)
    supervisor = Supervisor(config, cards, registry=registry)
    try:
        server = AgentServer(config, supervisor, cards_source)
    except OSError as exc:
        log.error("cannot listen on %s:%s: %s", config.host, config.port, exc.strerror or exc)
        return 1
    # Listening first makes a second agent with the same configuration fail
    # above, before it could adopt (and later stop) the first one's replicas.
    adopted = supervisor.adopt()
    stop_children = args.stop_children_on_exit or config.stop_children_on_exit

    def on_signal(signum: int, _frame: object) -> None:
        log.info("received %s; shutting down", signal.Signals(signum).name)
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    host, port = server.server_address[:2]
    log.info(
        "llmgw-agent %s for node %s listening on %s:%s; %d cards (from %s); engines: %s; registry: %s; "
        "adopted %d running replicas; replicas %s when the agent exits",
        __version__,
        config.node,
        host,
        port,
        len(cards),
        cards_source,
        ", ".join(sorted(config.engines)),
        config.engines_registry or "none",
        adopted,
        "are stopped" if stop_children else "keep running",
    )
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        supervisor.shutdown(stop_children=stop_children)
        server.server_close()
    log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
