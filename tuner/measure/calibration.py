"""A device's calibration history (device_agent/calibration.py judges a measuring worker's
calibration against it), per device key and host, so a worker that starts slow is told by the
calibrations earlier processes of the same device left, across runs. Two places keep it:

- **the records store** (`StoreSpeedHistory`, the `calibrations` table): what the farm's and the
  dashboard's views of a device read, shared by every worker of a store;
- **the host itself** (`HostSpeedHistory`, a file beside the host's timing lock): every store used
  on this host, and every runner without a store, add to it. A tuning on a fresh records file has
  no history in it, so its first windows, its default's timing among them, could not be judged:
  on a host that spends stretches of seconds in a slow regime, a default timed in one read 1.7x
  its speed and every candidate of the search was held against that. The host's file knows the
  device from earlier runs.

A store's worker judges against the longer of the two (both are this device on this host; the
longer knows more of it): a fresh store against the host's, a container's fresh file system
against its store's."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import socket

from compiler import host_lock
from device_agent.calibration import HISTORY_SIZE, SpeedHistory, comparable

log = logging.getLogger("tunefarm.calibration")

HOST_FILE_KEEP = 4 * HISTORY_SIZE   # calibrations a host's file keeps (older ones are dropped)


class StoreSpeedHistory(SpeedHistory):
    """SpeedHistory kept in the records store's `calibrations` table (SQLRecordsStore), judged
    against the longer of it and the host's file where `host` is this machine (`host_file=False`:
    the store's alone)."""

    def __init__(self, store, device_key: str = "local", host: str | None = None, host_file: bool = True):
        super().__init__()
        self.store, self.device_key = store, device_key
        self.host = host or socket.gethostname()
        mine = self.host == socket.gethostname()
        self.host_history = HostSpeedHistory(device_key) if host_file and mine else None

    def recent(self, cal: dict) -> list:
        own = self.store.calibrations(self.device_key, self.host, limit=4 * HISTORY_SIZE,
                                      version=cal.get("version"), threads=cal.get("threads"))
        if self.host_history is None:
            return own
        here = self.host_history.recent(cal)
        return here if len(here) > len(own) else own

    def add(self, cal: dict, state: str, index: float | None) -> None:
        self.store.add_calibration(self.device_key, self.host, cal, state, index)
        if self.host_history is not None:
            self.host_history.add(cal, state, index)


class HostSpeedHistory(SpeedHistory):
    """SpeedHistory kept in a JSON-lines file of this host (`directory`: default the host lock's,
    `$TUNEFARM_LOCK_DIR` or the temp directory, which every tunefarm process of the host shares),
    one per device key; the newest HOST_FILE_KEEP calibrations. A file that cannot be read or
    written leaves the history in memory for this process (logged once)."""

    def __init__(self, device_key: str = "local", directory: str | None = None):
        super().__init__()
        name = re.sub(r"[^A-Za-z0-9_.-]", "_", device_key)
        self.path = os.path.join(directory or host_lock.lock_dir(), f"tunefarm-calibrations-{name}.jsonl")
        self._broken = False

    def _fall_back(self, e: OSError) -> None:
        if not self._broken:
            log.warning("host calibration history %s unusable (%s): keeping this process's in memory", self.path, e)
        self._broken = True

    def recent(self, cal: dict) -> list:
        if self._broken:
            return super().recent(cal)
        try:
            with open(self.path, encoding="utf-8") as f:
                lines = f.read().splitlines()
        except FileNotFoundError:
            return []
        except OSError as e:
            self._fall_back(e)
            return super().recent(cal)
        out = []
        for line in lines[-2 * HOST_FILE_KEEP:]:
            try:
                item = json.loads(line)
            except ValueError:
                continue         # a line another process is writing, or a damaged one
            if isinstance(item, dict) and comparable(cal, item):
                out.append(item)
        return out[-HOST_FILE_KEEP:]

    def add(self, cal: dict, state: str, index: float | None) -> None:
        if self._broken:
            return super().add(cal, state, index)
        line = json.dumps(dict(cal, state=state, speed_index=index), separators=(",", ":")) + "\n"
        try:
            with open(self.path, "a+", encoding="utf-8") as f:
                fcntl.flock(f, fcntl.LOCK_EX)
                f.write(line)
                f.flush()
                f.seek(0)
                lines = f.read().splitlines(keepends=True)
                if len(lines) > 2 * HOST_FILE_KEEP:      # trimmed now and then, not at every add
                    f.seek(0)
                    f.truncate()
                    f.writelines(lines[-HOST_FILE_KEEP:])
        except OSError as e:
            self._fall_back(e)
            super().add(cal, state, index)
