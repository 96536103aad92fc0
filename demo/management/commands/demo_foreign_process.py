"""``python manage.py demo_foreign_process NODE --card N``: in the demo, a process the catalog does not
know holding memory on a card, as a training job or a stray notebook would on a real node.

It starts a sleeping process of its own (in a session of its own, so it outlives this command) and
registers it with the node's stand-in ``nvidia-smi`` the way the stand-in reads processes
(``proc-<pid>.json`` in its directory, agent/standin_nvidia_smi.py): the node's agent then reports
it on that card, the worker's next telemetry sample marks the card held by a foreign process, and
placement passes the card over. ``--stop`` ends the node's demo foreign processes (Ctrl-C of
``make run`` ends them too).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from catalog.models import Card, Node

MARK = "demo_foreign"  # set in the files this command writes, so --stop ends only its own processes


def demo_gpu_dir(node_name: str) -> Path:
    """Where ``manage.py demo`` keeps the node's stand-in nvidia-smi state."""
    return Path(settings.VAR_DIR) / "demo" / node_name / "gpus"


def stop_foreign_processes(gpu_dir: Path) -> list[int]:
    """End the processes this command started in ``gpu_dir`` and drop their files; their pids."""
    stopped = []
    for path in sorted(gpu_dir.glob("proc-*.json")):
        try:
            entry = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(entry, dict) or not entry.get(MARK):
            continue
        pid = int(entry["pid"])
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        path.unlink(missing_ok=True)
        stopped.append(pid)
    return stopped


class Command(BaseCommand):
    help = (
        "In the demo, start a process the catalog does not know holding memory on a node's card (the node's "
        "stand-in nvidia-smi reports it, the card shows as held), or end them with --stop."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("node", help="the node's name, e.g. gpu-h1")
        parser.add_argument(
            "--card", type=int, action="append", default=[], help="a card's index (repeat for more cards)"
        )
        parser.add_argument("--mib", type=int, default=20000, help="memory it holds on each card, in MiB")
        parser.add_argument("--name", default="python3 train.py", help="the process name nvidia-smi shows")
        parser.add_argument(
            "--gpu-dir",
            type=Path,
            help="the node's stand-in nvidia-smi directory (default: where `manage.py demo` puts it, "
            "var/demo/<node>/gpus)",
        )
        parser.add_argument("--stop", action="store_true", help="end this node's demo foreign processes")

    def handle(self, *args: Any, **options: Any) -> None:
        node = Node.objects.filter(name=options["node"]).first()
        if node is None:
            names = ", ".join(Node.objects.order_by("name").values_list("name", flat=True)) or "none"
            raise CommandError(f"No node is named {options['node']!r}; the catalog's nodes: {names}.")
        gpu_dir = options["gpu_dir"] or demo_gpu_dir(node.name)
        if not (gpu_dir / "cards.json").is_file():
            raise CommandError(
                f"{gpu_dir} has no stand-in nvidia-smi: start the demo first (make run, or python manage.py "
                "demo), or name the directory with --gpu-dir."
            )
        if options["stop"]:
            stopped = stop_foreign_processes(gpu_dir)
            self.stdout.write(
                f"{node.name}: ended foreign process(es) {', '.join(map(str, stopped))}"
                if stopped
                else f"{node.name}: no demo foreign process was running"
            )
            return
        if not options["card"]:
            raise CommandError("Name the card it holds with --card N (repeat for more cards).")
        indexes = set(Card.objects.filter(node=node).values_list("index", flat=True))
        missing = sorted(set(options["card"]) - indexes)
        if missing:
            raise CommandError(
                f"{node.name} has no card {', '.join(map(str, missing))}; its cards: "
                f"{', '.join(map(str, sorted(indexes)))}."
            )
        if options["mib"] <= 0:
            raise CommandError("--mib must be a positive number of MiB.")
        child = subprocess.Popen(
            [sys.executable, "-c", "import time\nwhile True: time.sleep(3600)"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # it outlives this command, as a real stray process would
        )
        entry = {
            "pid": child.pid,
            "cards": sorted(set(options["card"])),
            "used_mib": options["mib"],
            "name": options["name"],
            MARK: True,
        }
        (gpu_dir / f"proc-{child.pid}.json").write_text(json.dumps(entry))
        self.stdout.write(
            f"{node.name}: process {child.pid} ({options['name']}) holds {options['mib']} MiB on card(s) "
            f"{', '.join(map(str, entry['cards']))}; the nodes page shows it after the next telemetry sample. "
            f"End it with: python manage.py demo_foreign_process {node.name} --stop"
        )
