"""Per-tenant slots in the data directory (``crossaudit/service/shared.py``): one cap for every
process of a server, tenants apart, and a slot whose holder was killed with SIGKILL is free."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from crossaudit.service.shared import SLOTS_DIR, Slots

HOLDER = """
import sys, time
from pathlib import Path
from crossaudit.service.shared import Slots
with Slots(Path(sys.argv[1]), "replays").hold("acme", 2) as held:
    print("held" if held else "refused", flush=True)
    time.sleep(600)
"""


def test_one_cap_for_every_process_and_tenants_apart(tmp_path: Path) -> None:
    worker_a, worker_b = Slots(tmp_path, "replays"), Slots(tmp_path, "replays")  # two workers' views
    with worker_a.hold("acme", 2) as one, worker_b.hold("acme", 2) as two:
        assert one and two
        with worker_a.hold("acme", 2) as three, worker_b.hold("acme", 2) as four:
            assert not three and not four
        with worker_b.hold("globex", 2) as theirs:
            assert theirs
    with worker_b.hold("acme", 2) as again:
        assert again  # released at the end of the blocks
    slots = tmp_path / SLOTS_DIR / "replays"
    assert slots.stat().st_mode & 0o777 == 0o700
    assert {p.stat().st_mode & 0o777 for p in slots.iterdir()} == {0o600}
    assert not any("acme" in p.name for p in slots.iterdir())  # named by digest, whatever the tenant's name


def test_a_slot_is_free_once_its_holder_is_killed(tmp_path: Path) -> None:
    holders = [
        subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    try:
        assert [h.stdout.readline().strip() for h in holders] == ["held", "held"]  # type: ignore[union-attr]
        with Slots(tmp_path, "replays").hold("acme", 2) as held:
            assert not held
        os.kill(holders[0].pid, signal.SIGKILL)
        holders[0].wait(60)
        with Slots(tmp_path, "replays").hold("acme", 2) as held:
            assert held  # nothing to expire, no lease to wait for: the kernel dropped the lock
    finally:
        for h in holders:
            h.kill()
            h.wait(60)


def test_without_a_data_dir_the_slots_are_this_processs(tmp_path: Path) -> None:
    slots = Slots(None, "replays")
    with slots.hold("acme", 1) as one, slots.hold("acme", 1) as two:
        assert one and not two
    with slots.hold("acme", 1) as again:
        assert again
