"""The ports a replica takes on this node, and what the agent says of one rank of a
replica across nodes (the spec's ``group``, docs/agent-api.md).

Rank 0 serves: it binds the serving port, as a one-node replica does, and the
rendezvous port, where the other ranks join it. A rank > 0 is headless: it
binds neither (rank 0, possibly on this very host, holds them), so the agent
neither checks nor probes them for it; except where the launch policy says
the engine's ranks > 0 bind the serving port too (``ranks_bind_port``:
SGLang's dummy health check), where the agent checks that port for them. The agent cannot see whether a rank > 0
has joined its group; only rank 0's readiness says so, and the agent's record
says that in so many words."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from llmgw_policy import Policy

from .spec import AgentError, Spec


def bound_ports(spec: Spec, policy: Policy) -> tuple[int, ...]:
    """The ports the replica's engine listens on, on this node."""
    if spec.headless:
        eng = policy.engines.get(spec.engine)
        binds = eng is not None and eng.group is not None and eng.group.ranks_bind_port
        return (spec.port,) if binds else ()
    if spec.group is not None:
        return (spec.port, spec.group.port)
    return (spec.port,)


def port_refusal(
    spec: Spec,
    others: Iterable[tuple[str, str, Spec]],
    node: str,
    port_free: Callable[[int], bool],
    policy: Policy,
) -> AgentError | None:
    """Why ``spec`` may not take its ports here (409 ``port_busy``): another replica of this
    agent listens on one (``others``: id, state, spec of each replica holding resources), or
    another program holds it. None when they are free or when it binds none (headless)."""
    wanted = bound_ports(spec, policy)
    for other_id, other_state, other in others:
        taken = sorted(set(wanted) & set(bound_ports(other, policy)))
        if taken:
            return AgentError(
                409,
                "port_busy",
                f"Port {taken[0]} is used by replica {other_id} ({other_state}); pick another port.",
            )
    for port in wanted:
        if not port_free(port):
            what = "Port" if port == spec.port else "Rendezvous port"
            return AgentError(
                409,
                "port_busy",
                f"{what} {port} is in use by another program on node {node}; pick another port.",
            )
    return None


def headless_reason(spec: Spec) -> str:
    """What the agent says of a rank > 0 whose process is alive."""
    group = spec.group
    assert group is not None
    return (
        f"rank {group.rank} of {group.size} is running headless: it serves nothing here, so the "
        "agent does not probe it; whether it joined its group is known only through rank 0's "
        f"readiness (rank 0 waits for it at {group.address}:{group.port})"
    )


def engine_line(lines: list[str]) -> str:
    """The engine's last line in its log (a rank that exits says why there, as NCCL does), or ''."""
    for line in reversed(lines):
        if line.strip() and "llmgw-agent: " not in line:  # the agent's own lines are not the engine's
            return line.strip()[:500]
    return ""
