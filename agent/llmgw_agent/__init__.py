"""llmgw node agent: starts, watches and stops model replicas on one GPU node.

Standard library only: it runs on GPU nodes next to the engines, with nothing
installed but Python 3.11.
"""

from __future__ import annotations

__version__ = "0.1.0"
