"""The agent's card telemetry, read from nvidia-smi's query interface (here the stand-in's)."""

from __future__ import annotations

import tempfile
import time
import unittest
from pathlib import Path

from agent_fakes import foreign_process, standin_gpus
from agent_testing import free_port, running_agent, standin_spec
from llmgw_agent.telemetry import parse_apps, parse_gpus

H100 = 81559


class TheParsers(unittest.TestCase):
    def test_nvidia_smis_csv_lines_become_cards_and_processes(self) -> None:
        # As nvidia-smi 550 prints them with --format=csv,noheader,nounits.
        gpus = parse_gpus(
            "0, GPU-6a1b, 73412, 81559, 97, 64, 0\n1, GPU-7c2d, 0, 81559, 0, 31, 2\n"
            "2, GPU-8e3f, [N/A], 81559, [N/A], 40, [N/A]\n"
        )
        self.assertEqual(
            [
                (g["index"], g["memory_used_mib"], g["utilization_percent"], g["ecc_uncorrected"])
                for g in gpus
            ],
            [(0, 73412, 97, 0), (1, 0, 0, 2), (2, None, None, None)],  # card 2: no ECC to count
        )
        apps = parse_apps("GPU-6a1b, 4242, 73400, /usr/bin/python3 -m vllm.entrypoints, openai\n")
        self.assertEqual(apps[0]["pid"], 4242)
        self.assertEqual(apps[0]["name"], "/usr/bin/python3 -m vllm.entrypoints, openai")


class TheTelemetry(unittest.TestCase):
    def setUp(self) -> None:
        self.tmp = Path(self.enterContext(tempfile.TemporaryDirectory(prefix="llmgw-telemetry-")))
        cards = [{"index": i, "name": "NVIDIA H100 80GB HBM3", "memory_mib": H100} for i in range(3)]
        self.gpus = self.tmp / "gpus"
        env = standin_gpus(self.gpus, cards)
        self.agent = self.enterContext(running_agent(self.tmp / "agent", cards=cards, env=env))
        self.http = self.enterContext(self.agent.client())

    def telemetry(self) -> dict:
        response = self.http.get("/v1/telemetry")
        self.assertEqual(response.status_code, 200, response.text)
        return response.json()

    def test_each_card_says_what_holds_its_memory_and_a_foreign_process_is_named_by_no_replica(self) -> None:
        response = self.http.put("/v1/replicas/r1", json=standin_spec(port=free_port(), cards=[0]))
        self.assertEqual(response.status_code, 201, response.text)
        self.agent.wait_for_state("r1", "ready")
        with foreign_process(self.gpus, [2], used_mib=30000) as pid:
            time.sleep(2.1)  # past the bounded rate's interval: a fresh sample
            body = self.telemetry()
        self.assertEqual(body["source"], "nvidia-smi")
        cards = {c["index"]: c for c in body["cards"]}
        self.assertEqual(cards[0]["memory_total_mib"], H100)
        self.assertEqual(cards[0]["memory_used_mib"], round(0.9 * H100))  # vLLM's default fraction
        self.assertEqual([p["replica"] for p in cards[0]["processes"]], ["r1"])
        self.assertEqual((cards[1]["memory_used_mib"], cards[1]["processes"]), (0, []))
        self.assertEqual(
            [(p["pid"], p["used_mib"], p["replica"]) for p in cards[2]["processes"]], [(pid, 30000, None)]
        )

    def test_a_cards_uncorrected_ecc_errors_are_reported(self) -> None:
        (self.gpus / "ecc.json").write_text('{"1": 3}')  # the stand-in's card 1 has had three
        cards = {c["index"]: c for c in self.telemetry()["cards"]}
        self.assertEqual([cards[i]["ecc_uncorrected"] for i in range(3)], [0, 3, 0])

    def test_the_sample_is_reused_within_the_interval_so_polling_cannot_run_nvidia_smi_hot(self) -> None:
        first = self.telemetry()
        again = [self.telemetry()["at"] for _ in range(5)]
        self.assertEqual(set(again), {first["at"]})
        time.sleep(2.1)
        self.assertGreater(self.telemetry()["at"], first["at"])


class WithoutNvidiaSmi(unittest.TestCase):
    def test_the_configured_cards_are_reported_with_their_total_and_nothing_measured(self) -> None:
        tmp = Path(self.enterContext(tempfile.TemporaryDirectory(prefix="llmgw-telemetry-")))
        agent = self.enterContext(running_agent(tmp / "agent", env={"PATH": "/usr/bin:/bin"}))
        with agent.client() as http:
            body = http.get("/v1/telemetry").json()
        self.assertEqual(body["source"], "config")
        self.assertTrue(all(c["memory_used_mib"] is None for c in body["cards"]))


if __name__ == "__main__":
    unittest.main()
