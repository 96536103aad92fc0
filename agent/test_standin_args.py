"""The stand-in engine's own flags, parsed by hand (standin_args.parse_args): as argparse's
``parse_known_args`` did, names in full, ``--flag value`` or ``--flag=value``, a wrong value an
error (exit status 2), and every argument it does not know passed through in its order, so that a
real engine's flags reach it unchanged. A stand-in's start imports neither argparse nor, without
stand-in cards, standin_memory: on the machine a benchmark measures, sixteen stand-ins start at once
(standard library only)."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import textwrap
import unittest
from pathlib import Path
from unittest import mock

AGENT = Path(__file__).resolve().parent
sys.path.insert(0, str(AGENT))

import standin_args  # noqa: E402  (beside this file)


class StandinArgsTest(unittest.TestCase):
    def _refused(self, argv: list[str]) -> str:
        said = io.StringIO()
        with contextlib.redirect_stderr(said), self.assertRaises(SystemExit) as ended:
            standin_args.parse_args(argv)
        self.assertEqual(ended.exception.code, 2)
        return said.getvalue()

    def test_its_flags_are_read_and_a_real_engines_pass_through_in_order(self) -> None:
        args, unknown = standin_args.parse_args(
            [
                "--model",
                "meta-llama/Llama-3.1-8B-Instruct",
                "--port=8101",
                "--tensor-parallel-size",
                "2",
                "--alias",
                "llama",
                "--load-seconds",
                "0.5",
                "--never-ready",
                "--crash-after=3",
                "--exit-at-start",
                "7",
                "--play",
                "sglang",
                "--enable-prefix-caching",
            ]
        )
        self.assertEqual(
            unknown,
            [
                "--model",
                "meta-llama/Llama-3.1-8B-Instruct",
                "--tensor-parallel-size",
                "2",
                "--enable-prefix-caching",
            ],
        )
        self.assertEqual((args.port, args.served_model_name, args.host), (8101, "llama", "127.0.0.1"))
        self.assertEqual((args.load_seconds, args.crash_after, args.exit_at_start), (0.5, 3.0, 7))
        self.assertEqual((args.never_ready, args.ignore_sigterm, args.play), (True, False, "sglang"))

    def test_the_environment_gives_what_no_flag_does(self) -> None:
        env = {
            "LLMGW_REPLICA_PORT": "8102",
            "LLMGW_SERVED_MODEL": "qwen",
            "STANDIN_LOAD_SECONDS": "1.5",
            "STANDIN_IGNORE_SIGTERM": "yes",
        }
        with mock.patch.dict(os.environ, env, clear=True):
            args, unknown = standin_args.parse_args(["--served-model-name", "mistral"])
        self.assertEqual(unknown, [])
        self.assertEqual((args.port, args.served_model_name, args.load_seconds), (8102, "mistral", 1.5))
        self.assertEqual((args.ignore_sigterm, args.never_ready, args.crash_after), (True, False, None))

    def test_a_wrong_or_missing_value_is_an_error_that_says_which(self) -> None:
        self.assertIn("argument --port: invalid int value: 'abc'", self._refused(["--port", "abc"]))
        self.assertIn("argument --load-seconds: expected one argument", self._refused(["--load-seconds"]))
        self.assertIn("argument --port: expected one argument", self._refused(["--port", "--never-ready"]))
        self.assertIn(
            "argument --never-ready: ignored explicit argument '1'",
            self._refused(["--port", "1", "--never-ready=1"]),
        )
        with mock.patch.dict(os.environ, {}, clear=True):
            self.assertIn("no port: pass --port or set LLMGW_REPLICA_PORT", self._refused([]))

    def test_a_name_given_in_part_is_not_taken_for_the_stand_ins_own(self) -> None:
        # argparse was told allow_abbrev=False: a real engine's --load-format is not --load-seconds.
        with mock.patch.dict(os.environ, {}, clear=True):
            args, unknown = standin_args.parse_args(["--port", "1", "--load", "x", "--port-offset", "2"])
        self.assertEqual((args.port, args.load_seconds), (1, 2.0))
        self.assertEqual(unknown, ["--load", "x", "--port-offset", "2"])

    def test_its_start_imports_none_of_what_it_was_trimmed_of(self) -> None:
        # argparse, typing and http.server: most of a stand-in's CPU at its start, which the
        # fan-out benchmark pays sixteen times at once; standin_memory: only with stand-in cards.
        code = """
            import sys
            sys.path.insert(0, ".")
            import standin_engine
            args, unknown = standin_engine.parse_args(["--port", "1"])
            print(standin_engine.play_startup(args, unknown))
            print(*(m in sys.modules for m in ("argparse", "typing", "http.server", "standin_memory")))
        """
        env = {k: v for k, v in os.environ.items() if k not in ("STANDIN_GPU_DIR", "CUDA_VISIBLE_DEVICES")}
        done = subprocess.run(
            [sys.executable, "-I", "-S", "-c", textwrap.dedent(code)],
            cwd=AGENT,
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        self.assertEqual(done.stdout.split(), ["None", "False", "False", "False", "False"])


if __name__ == "__main__":
    unittest.main()
