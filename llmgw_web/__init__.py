"""The llmgw-web Django project.

The launch policy (``llmgw_policy``) lives beside the node agent in
``agent/``, so that an agent deployed on its own carries it; the control
plane imports the same module from there.
"""

import sys
from pathlib import Path

_AGENT_DIR = str(Path(__file__).resolve().parent.parent / "agent")
if _AGENT_DIR not in sys.path:
    sys.path.append(_AGENT_DIR)
