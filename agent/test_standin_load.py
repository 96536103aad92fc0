"""The stand-in engine's load counts from its process's start, as a real engine's does: the time its
interpreter took to start and import is part of ``--load-seconds``, not added to it (standard
library only)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import unittest
from pathlib import Path

AGENT = Path(__file__).resolve().parent


class StandinLoadTest(unittest.TestCase):
    def _run(self, code: str) -> str:
        done = subprocess.run(
            [sys.executable, "-I", "-S", "-c", textwrap.dedent(code)],
            cwd=AGENT,
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        return done.stdout.strip()

    def test_the_load_counts_from_the_process_start_not_from_the_engine_object(self) -> None:
        # The process sleeps 0.6 s before it makes its Engine (as an interpreter slow to start
        # would): told to load for 0.5 s, it is loaded at once, since its process started 0.6 s ago.
        said = self._run(
            """
            import sys, time
            time.sleep(0.6)
            sys.path.insert(0, ".")
            import standin_engine
            args, _ = standin_engine.parse_args(["--port", "1", "--load-seconds", "0.5"])
            engine = standin_engine.Engine(args, [])
            print(engine.loaded, round(time.monotonic() - engine.started, 1))
            """
        )
        loaded, age = said.split()
        self.assertEqual(loaded, "True")
        self.assertGreaterEqual(float(age), 0.6)

    def test_a_load_longer_than_the_start_still_waits_its_time(self) -> None:
        said = self._run(
            """
            import sys, time
            sys.path.insert(0, ".")
            import standin_engine
            args, _ = standin_engine.parse_args(["--port", "1", "--load-seconds", "1.5"])
            engine = standin_engine.Engine(args, [])
            before = engine.loaded
            time.sleep(max(1.5 - (time.monotonic() - engine.started), 0) + 0.05)
            print(before, engine.loaded)
            """
        )
        self.assertEqual(said, "False True")


if __name__ == "__main__":
    unittest.main()
