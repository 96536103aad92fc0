"""A node's agent token rotated without downtime: the agent's side first, the catalog's after."""

from __future__ import annotations

import secrets as token_source

from agentclient.client import AgentCallFailed, AgentClient
from base.actor import Actor
from base.errors import DomainError
from catalog.models import Node
from catalog.services.catalog import node_token_save


def node_rotate_token(*, instance: Node, grace_seconds: float = 300.0, actor: Actor | None = None) -> Node:
    """Give the node's agent a new token without downtime: the agent takes it
    (and keeps accepting the old one for ``grace_seconds``), answers with it,
    and only then is it saved here, audited by fingerprint. Nothing is saved
    when the agent does not confirm."""
    new_token = token_source.token_urlsafe(32)
    try:
        AgentClient.for_node(instance).rotate_token(new_token, grace_seconds=grace_seconds)
    except AgentCallFailed as exc:
        raise DomainError("agent_refused", f"The token was not rotated: {exc.message}") from None
    confirming = Node(name=instance.name, agent_url=instance.agent_url, agent_token=new_token)
    try:
        AgentClient.for_node(confirming).node_info()
    except AgentCallFailed as exc:
        raise DomainError(
            "agent_refused",
            f"The agent of node {instance.name} took the new token but did not answer with it ({exc.message}); "
            f"the catalog keeps the old one, which the agent accepts for {grace_seconds:g} s more: try again.",
        ) from None
    return node_token_save(instance=instance, new_token=new_token, grace_seconds=grace_seconds, actor=actor)
