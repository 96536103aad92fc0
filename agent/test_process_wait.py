"""Waiting for an engine's process to end: the agent's watcher waits on every live replica for as
long as it lives, so a wait must sleep until the process ends rather than poll it.

Real processes, standard library only like the agent: ``python -m unittest`` from ``agent/``.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
import unittest
from unittest import mock

from llmgw_agent.process import AdoptedProcess, ChildProcess, proc_stat

HAS_PIDFD = hasattr(os, "pidfd_open")


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


class WaitingForAChild(unittest.TestCase):
    def started(self, *argv: str) -> ChildProcess:
        popen = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL)
        self.addCleanup(popen.wait)
        self.addCleanup(popen.kill)
        return ChildProcess(popen)

    @unittest.skipUnless(HAS_PIDFD, "no os.pidfd_open here (Linux 5.3 and later)")
    def test_a_wait_on_a_live_child_sleeps_without_calling_waitpid_and_ends_when_it_does(self) -> None:
        before = open_descriptors()
        child = self.started("sleep", "0.6")
        with mock.patch("os.waitpid", wraps=os.waitpid) as waitpid:
            self.assertFalse(child.wait(0.3))
            self.assertEqual(waitpid.call_count, 0, "a wait on a live child polled waitpid")
        began = time.monotonic()
        self.assertTrue(child.wait(10))
        self.assertLess(time.monotonic() - began, 2.0, "the wait did not end when the child did")
        self.assertEqual(child.exit_code(), 0)
        self.assertTrue(child.exited())
        self.assertEqual(open_descriptors(), before, "the pidfd was left open after the child ended")

    def test_without_a_pidfd_a_wait_still_sees_the_child_end_with_its_exit_code(self) -> None:
        with mock.patch.object(
            os, "pidfd_open", side_effect=OSError(38, "Function not implemented"), create=True
        ):
            child = self.started("sh", "-c", "sleep 0.3; exit 3")
        self.assertFalse(child.wait(0.05))
        self.assertTrue(child.wait(10))
        self.assertEqual(child.exit_code(), 3)

    def test_two_threads_waiting_on_one_child_both_see_it_end(self) -> None:
        child = self.started("sleep", "0.4")
        seen: list[bool] = []
        threads = [threading.Thread(target=lambda: seen.append(child.wait(10))) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(15)
        self.assertEqual(seen, [True, True])
        self.assertEqual(child.exit_code(), 0)


class WaitingForAnAdoptedProcess(unittest.TestCase):
    """An engine an earlier run of the agent started: not this process's child."""

    def orphan(self, seconds: float) -> tuple[int, int]:
        """A ``sleep`` whose parent has exited (it is not ours to reap): its pid and start time."""
        out = subprocess.run(
            ["sh", "-c", f"sleep {seconds} >/dev/null 2>&1 & echo $!"],
            capture_output=True,
            text=True,
            check=True,
        )
        pid = int(out.stdout.strip())
        self.addCleanup(lambda: subprocess.run(["kill", "-9", str(pid)], capture_output=True))
        stat = proc_stat(pid)
        assert stat is not None, "the orphan ended before it could be adopted"
        return pid, stat[1]

    def test_a_wait_on_an_adopted_process_ends_when_it_does(self) -> None:
        before = open_descriptors()
        pid, starttime = self.orphan(0.6)
        adopted = AdoptedProcess(pid, starttime)
        self.assertFalse(adopted.wait(0.1))
        self.assertTrue(adopted.wait(10))
        self.assertTrue(adopted.exited())
        self.assertEqual(open_descriptors(), before, "the pidfd was left open after the process ended")

    def test_a_pid_reused_by_another_process_counts_as_gone(self) -> None:
        pid, starttime = self.orphan(30)
        adopted = AdoptedProcess(pid, starttime - 1)  # recorded for a process that started earlier
        self.assertTrue(adopted.exited())
        self.assertTrue(adopted.wait(5))


if __name__ == "__main__":
    unittest.main()
