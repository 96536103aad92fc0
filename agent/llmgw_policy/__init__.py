"""The launch policy shared by the control plane and the node agent: what a
profile may pass to an engine, read from ``policy.toml`` beside this package
(see its header for every key).

One interpreter for the control plane and the node agent. Both call
``check_profile`` (the control plane on every write path and when it builds a
spec; the agent on the part of a spec after the launcher's own arguments) and
the agent calls ``check_spec`` on the whole spec. Standard library only: the
agent imports this on GPU nodes with nothing else installed.

Arguments are read the way each engine's parser reads them: "_" as "-" where
the parser folds them (vLLM, llama.cpp), ``--flag=value`` where it splits them
(argparse, click), the next token as a flag's value. Only the exact spellings
listed pass; anything else is refused with a sentence that says which
argument and why.

The modules, each about one thing:

- ``tokens``: the grammar of a profile's tokens (what is a flag, a whole
  number, a variable's name), which the planning core reads arguments by too;
- ``model``: the policy as frozen dataclasses, and ``Refusal``;
- ``loading``: ``policy.toml`` read and checked into the model;
- ``kinds``: value kinds and their checks;
- ``parsing``: an argument list read as the engine's parser reads it;
- ``arguments`` and ``environment``: a profile's arguments and variables checked;
- ``profile``: ``check_profile``, the entry point, with the size limits;
- ``source``: a model's source (repo id or a path under the model roots);
- ``spec``: the launcher's own arguments, ``launch_args`` and ``check_spec``;
- ``group``: the rank flags of a replica across nodes (``GroupSpec``, ``group_args``);
- ``redaction``: secret values (and their encoded and split copies) taken out of text.
"""

from .group import GroupSpec, group_args
from .loading import POLICY_PATH, default_policy, load_policy
from .model import EnginePolicy, Limits, Policy, PolicyError, Refusal, ValueRule
from .profile import check_profile
from .redaction import REDACTED, redact, redact_lines, secret_forms
from .source import parse_roots, source_refusal, split_source
from .spec import check_spec, launch_args
from .tokens import is_flag, parse_int

__all__ = [
    "POLICY_PATH",
    "REDACTED",
    "EnginePolicy",
    "GroupSpec",
    "Limits",
    "Policy",
    "PolicyError",
    "Refusal",
    "ValueRule",
    "check_profile",
    "check_spec",
    "default_policy",
    "group_args",
    "is_flag",
    "launch_args",
    "load_policy",
    "parse_int",
    "parse_roots",
    "redact",
    "redact_lines",
    "secret_forms",
    "source_refusal",
    "split_source",
]
