"""A device's calibration history in the records store (device_agent/calibration.py judges a
measuring worker's calibration against it): per device key and host, so a worker that starts
slow is told by the calibrations earlier processes of the same device left, across runs."""

from __future__ import annotations

import socket

from device_agent.calibration import HISTORY_SIZE, SpeedHistory


class StoreSpeedHistory(SpeedHistory):
    """SpeedHistory kept in the records store's `calibrations` table (SQLRecordsStore)."""

    def __init__(self, store, device_key: str = "local", host: str | None = None):
        super().__init__()
        self.store, self.device_key = store, device_key
        self.host = host or socket.gethostname()

    def recent(self, cal: dict) -> list:
        return self.store.calibrations(self.device_key, self.host, limit=4 * HISTORY_SIZE,
                                       version=cal.get("version"), threads=cal.get("threads"))

    def add(self, cal: dict, state: str, index: float | None) -> None:
        self.store.add_calibration(self.device_key, self.host, cal, state, index)
