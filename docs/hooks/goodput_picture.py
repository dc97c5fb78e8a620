"""Draw the goodput picture of docs/observability.md from a real run on the simulator.

A resilient run on two v4 2x2x2 slices: it waits behind another reservation, beats every
step, saves a checkpoint, is warned of preemption and saves again before it leaves, and
finishes on the other slice. ``tpuslice goodput``'s rendering of its account is written as
``docs/img/goodput.svg`` (and printed). Not a MkDocs hook: run it by hand, on a machine
with no other simulated cluster running::

    python docs/hooks/goodput_picture.py
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import ray
from rich.console import Console

import tpuslice
from tpuslice.cli.goodput_view import render_account
from tpuslice.record import goodput
from tpuslice.testing import SimulatedCluster

OUTPUT = Path(__file__).resolve().parents[1] / "img" / "goodput.svg"
V4 = {"topology": "2x2x2", "accelerator_version": "v4"}


@ray.remote
def train(flags: str) -> str:
    """A training loop: a step every 50 ms, a save (0.5 s) after 3 s of work and when the
    slice's save flag appears; ends when the go flag does."""
    host = tpuslice.current_host()
    began = time.time()
    saved = saved_on_notice = False
    while not Path(flags, "go").exists():
        if not saved and time.time() - began > 3.0:
            time.sleep(0.5)
            tpuslice.checkpointed(step=60)
            Path(flags, f"ckpt-{host.slice_name}").touch()
            saved = True
        if not saved_on_notice and Path(flags, f"save-{host.slice_name}").exists():
            time.sleep(0.5)
            tpuslice.checkpointed(step=90)
            Path(flags, f"saved-{host.slice_name}-{host.rank}").touch()
            saved_on_notice = True
        tpuslice.heartbeat()
        time.sleep(0.05)
    return host.slice_name


def main() -> None:
    """Run the history and draw its account."""
    flags = Path("/tmp") / f"tpuslice-goodput-picture-{time.time_ns()}"
    flags.mkdir()
    accounts: list[goodput.Account] = []

    def on_notice(event: tpuslice.AttemptEvent) -> None:
        (victim,) = event.slice_names
        Path(flags, f"save-{victim}").touch()
        deadline = time.monotonic() + 20
        while len(list(flags.glob(f"saved-{victim}-*"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)

    with SimulatedCluster([("v4", "2x2x2", 2)]) as sim:
        sim.connect()
        other = tpuslice.SlicePlacementGroup(**V4, num_slices=2)  # another job, for 3 s
        threading.Timer(3.0, other.shutdown).start()
        run = threading.Thread(
            target=lambda: tpuslice.run_resilient(
                train, str(flags), **V4, on_notice=on_notice, on_account=accounts.append
            )
        )
        run.start()
        while not (saved := list(flags.glob("ckpt-*"))):  # the first attempt saved
            if not run.is_alive():
                raise SystemExit("the run ended early")
            time.sleep(0.1)
        time.sleep(2.0)  # more work after the checkpoint, then the notice
        thread = sim.preempt_slice(saved[0].name.removeprefix("ckpt-"), notice_s=10, wait=False)
        while len(list(flags.glob("saved-*"))) < 2:
            time.sleep(0.1)
        time.sleep(6.0)  # the second attempt's work
        Path(flags, "go").touch()
        run.join(120)
        if thread is not None:
            thread.join(30)
    (account,) = accounts
    console = Console(record=True, width=80)
    console.print(render_account(account, width=80))
    OUTPUT.parent.mkdir(exist_ok=True)
    console.save_svg(str(OUTPUT), title="tpuslice goodput")
    print(f"wrote {OUTPUT}")


if __name__ == "__main__":
    main()
