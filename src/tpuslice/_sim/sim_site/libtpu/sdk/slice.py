"""``libtpu.sdk.slice`` on a simulated host: this host's chips and their coordinates, read
from ``chip_coords.json`` that the simulator wrote under the host root."""

from __future__ import annotations

import json
import os
from pathlib import Path

COORDS_FILE = "chip_coords.json"


class Chip:
    """One chip, as libtpu's SDK reports it."""

    def __init__(self, hostname: str, chip_index: int, coordinates: list[int]) -> None:
        self._hostname = hostname
        self._chip_index = chip_index
        self._coordinates = list(coordinates)

    def hostname(self) -> str:
        return self._hostname

    def chip_index(self) -> int:
        return self._chip_index

    def coordinates(self) -> list[int]:
        return list(self._coordinates)


def get_chip_coordinates() -> list[Chip]:
    """This host's chips with their coordinates; ``RuntimeError`` off a simulated host."""
    root = os.environ.get("TPUSLICE_SIM_HOST_ROOT")
    if not root or not (Path(root) / COORDS_FILE).exists():
        raise RuntimeError("no TPU chips on this host (not a simulated TPU host)")
    data = json.loads((Path(root) / COORDS_FILE).read_text())
    return [Chip(data["hostname"], i, c) for i, c in enumerate(data["coordinates"])]
