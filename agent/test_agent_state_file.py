"""The agent's state file (its replica table, for adopting engines after a restart) is written
after the table's lock is let go: a slow write holds up no reader, start or stop of the node,
and a start is still answered only once the file holds it.

A named pipe stands where the agent writes the file before moving it into place, so the write
waits (opening a pipe to write waits for a reader) until the test reads it: the agent's own code
over HTTP on 127.0.0.1, a real engine, nothing of the agent replaced.
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any

from agent_cases import InATemporaryDirectory
from agent_testing import agent_in_thread, free_port, standin_spec, wait_until


class TheStateFile(InATemporaryDirectory):
    def test_a_write_that_waits_holds_up_no_reader_and_the_start_is_answered_once_written(self) -> None:
        with agent_in_thread(self.tmp_path / "agent") as agent:
            state = agent.log_dir / "replicas.json"
            pipe = state.with_name(f".{state.name}.tmp")
            os.mkfifo(pipe)
            answered: dict[str, Any] = {}

            def start() -> None:
                with agent.client() as http:
                    answered["start"] = http.put("/v1/replicas/r1", json=standin_spec(port=free_port()))

            putting = threading.Thread(target=start)
            putting.start()
            try:
                with agent.client(timeout=5.0) as http:
                    # The table holds the new replica while its write waits, and says so at once.
                    listed = wait_until(
                        lambda: [r for r in http.get("/v1/replicas").json() if r["id"] == "r1"],
                        what="r1 in the table",
                    )
                    assert listed[0]["state"] in ("starting", "loading")
                    assert http.get("/v1/node").json()["cards"][0]["replica"] == "r1"
                assert "start" not in answered  # not answered before the file holds it
            finally:
                with open(pipe, encoding="utf-8") as reader:  # the write goes on
                    written = json.loads(reader.read())
                putting.join(timeout=10)
            assert answered["start"].status_code == 201
            assert [(r["id"], r["pid"]) for r in written["replicas"]] == [
                ("r1", answered["start"].json()["pid"])
            ]
            agent.wait_for_state("r1", "ready")
            # Later changes are written over the pipe's place as ever: the file says ready.
            wait_until(
                lambda: state.is_file() and json.loads(state.read_text())["replicas"][0]["state"] == "ready",
                what="the file to say r1 is ready",
            )
