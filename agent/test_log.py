"""The agent serves the tail of a replica's engine log: bounded, at a bounded rate, secrets redacted."""

from __future__ import annotations

import base64
import tempfile
import time
import unittest
from pathlib import Path

from agent_testing import free_port, running_agent, standin_spec


class TheLogTail(unittest.TestCase):
    def setUp(self) -> None:
        tmp = Path(self.enterContext(tempfile.TemporaryDirectory(prefix="llmgw-log-")))
        self.agent = self.enterContext(running_agent(tmp / "agent"))
        self.http = self.enterContext(self.agent.client())

    def test_the_tail_shows_the_engines_lines_with_its_secrets_replaced(self) -> None:
        secret = "hf_" + "s" * 30
        spec = standin_spec(port=free_port(), env={"HF_TOKEN": secret})
        self.assertEqual(self.http.put("/v1/replicas/r1", json=spec).status_code, 201)
        self.agent.wait_for_state("r1", "ready")
        raw = (self.agent.log_dir / "r1.attempt-1.log").read_text()
        self.assertIn(secret, raw)  # the engine wrote it; the agent must not pass it on
        time.sleep(0.6)  # past the read interval
        body = self.http.get("/v1/replicas/r1/log", params={"lines": "50"}).json()
        text = "\n".join(body["lines"])
        self.assertEqual(body["state"], "ready")
        self.assertIn("logging in to the Hugging Face Hub with token ***", text)
        self.assertIn("listening on", text)
        self.assertNotIn(secret, text)
        # Its encoded and split copies too: base64'd in a header, upper-cased, wrapped over two lines.
        encoded = base64.b64encode(f"Authorization: Bearer {secret}".encode()).decode()
        self.assertIn(encoded, raw)
        for copy in (encoded[len(encoded) // 2 :], secret.upper(), secret[: len(secret) // 2]):
            self.assertNotIn(copy, text)
        self.assertIn("TOKEN IN CAPITALS: ***", text)
        self.assertIn("(its end)", text)

    def test_size_and_rate_are_bounded(self) -> None:
        self.assertEqual(
            self.http.put("/v1/replicas/r1", json=standin_spec(port=free_port())).status_code, 201
        )
        self.agent.wait_for_state("r1", "ready")
        time.sleep(0.6)
        first = self.http.get("/v1/replicas/r1/log", params={"lines": "2"}).json()["lines"]
        self.assertEqual(len(first), 2)
        # Within the interval the file is not read again: the same lines, whatever was written since.
        with (self.agent.log_dir / "r1.attempt-1.log").open("a") as log:
            log.write("a line written after the first read\n")
        self.assertEqual(self.http.get("/v1/replicas/r1/log", params={"lines": "2"}).json()["lines"], first)
        time.sleep(0.6)
        again = self.http.get("/v1/replicas/r1/log", params={"lines": "2"}).json()["lines"]
        self.assertEqual(again[-1], "a line written after the first read")
        too_many = self.http.get("/v1/replicas/r1/log", params={"lines": "501"})
        self.assertEqual((too_many.status_code, too_many.json()["code"]), (400, "invalid_lines"))
        self.assertEqual(self.http.get("/v1/replicas/nope/log").status_code, 404)


if __name__ == "__main__":
    unittest.main()


class TheAttempts(unittest.TestCase):
    """Each start attempt's log is kept, bounded: a crash loop's first failure stays readable."""

    def setUp(self) -> None:
        tmp = Path(self.enterContext(tempfile.TemporaryDirectory(prefix="llmgw-attempts-")))
        self.agent = self.enterContext(
            running_agent(tmp / "agent", extra={"log_attempts": 3, "log_attempt_bytes": 4096})
        )
        self.http = self.enterContext(self.agent.client())

    def start(self, env: dict[str, str]) -> None:
        spec = standin_spec(port=free_port(), engine="standin", env=env)
        self.assertEqual(self.http.put("/v1/replicas/r1", json=spec).status_code, 201)

    def test_a_crash_loops_first_attempt_and_latest_ones_are_kept_and_listed(self) -> None:
        self.start({"STANDIN_EXIT_AT_START": "3"})
        self.agent.wait_for_state("r1", "failed")
        # The first attempt's log is long: cut to its last bytes once the next one starts.
        with (self.agent.log_dir / "r1.attempt-1.log").open("a") as log:
            log.write("filler line\n" * 1000 + "the first real error\n")
        for code in ("4", "5", "6"):
            self.start({"STANDIN_EXIT_AT_START": code})
            self.agent.wait_for_state("r1", "failed")
        listed = self.http.get("/v1/replicas/r1/attempts").json()["attempts"]
        # Three kept: the first, and the latest two (attempt 2 and 3 were dropped).
        self.assertEqual([a["attempt"] for a in listed], [1, 3, 4])
        self.assertEqual([a["current"] for a in listed], [False, False, True])
        self.assertTrue(listed[0]["cut"] and listed[0]["bytes"] <= 4096 + 100)
        self.assertIsNotNone(listed[2]["started_at"])
        first = self.http.get("/v1/replicas/r1/log", params={"attempt": "1", "lines": "5"}).json()
        self.assertEqual(first["lines"][-1], "the first real error")
        third = self.http.get("/v1/replicas/r1/log", params={"attempt": "3", "lines": "50"}).json()
        self.assertIn("exiting with code 5", "\n".join(third["lines"]))
        current = self.http.get("/v1/replicas/r1/log", params={"lines": "50"}).json()
        self.assertIn("exiting with code 6", "\n".join(current["lines"]))
        gone = self.http.get("/v1/replicas/r1/log", params={"attempt": "2"})
        self.assertEqual((gone.status_code, gone.json()["code"]), (404, "not_found"))
        self.assertIn("the kept ones are 1, 3, 4", gone.json()["detail"])
        bad = self.http.get("/v1/replicas/r1/log", params={"attempt": "x"})
        self.assertEqual((bad.status_code, bad.json()["code"]), (400, "invalid_attempt"))
        self.assertEqual(
            sorted(p.name for p in self.agent.log_dir.glob("r1.attempt-*.log")),
            ["r1.attempt-1.log", "r1.attempt-3.log", "r1.attempt-4.log"],
        )


class TheAttemptSettings(unittest.TestCase):
    def test_a_count_or_size_that_is_not_a_whole_number_in_bounds_is_refused_naming_it(self) -> None:
        from llmgw_agent.config import ConfigError, load_config

        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "agent.toml"
            path.write_text(
                'node = "n"\ntoken = "'
                + "t" * 40
                + '"\nlog_attempts = 2\n[engines.vllm]\ncommand = ["vllm", "serve"]\n'
            )
            self.assertEqual(load_config(path, environ={}).log_attempts, 2)
            for bad in ("0", "2.5", "many"):
                with self.assertRaises(ConfigError) as caught:
                    load_config(path, environ={"LLMGW_AGENT_LOG_ATTEMPTS": bad})
                self.assertIn("LLMGW_AGENT_LOG_ATTEMPTS", str(caught.exception))
                self.assertIn("whole number from 1 to 100", str(caught.exception))
