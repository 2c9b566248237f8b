"""Hosts of the tests' own on this one machine: network namespaces joined by long-distance links.

`Hosts(n_agents)` makes one namespace for the service side (the tracker and the tuner: a data
centre) and one per agent (boards somewhere else), and takes all of them down again in
`close()`, which the tests' fixtures call even when a test fails:

    root namespace (pytest)                        service namespace                agent namespace i
    10.213.S.1 ──── veth (the console) ──── 10.213.S.2 = the tracker's address
                                             10.213.(10+i).1 ──── wire i ──── 10.213.(10+i).2, default route
                                                                               nftables: nothing new comes in

- **Addresses** are of the project's own range, 10.213.0.0/16, and live only inside the
  namespaces made here (the console's /24 in the root namespace too): nothing outside this
  machine is ever a target. Namespaces are named `tf-<pid>-<n>-…` so a crashed run's leftovers
  are recognised and swept (`sweep_stale`) by the next one.
- **The agents' links** are `tests/netns_wire.py` TUN pairs with delay and loss in each direction:
  what `tc netem` would do on a veth, which this kernel (and CI's) does not have.
- **One-way**: an agent's namespace drops every inbound connection that it did not open itself
  (nftables, conntrack's `established,related`), as a board behind NAT: only agents dial out.
- **The tracker and the tuner** share the service namespace, so the tuner reaches the tracker over
  that namespace's loopback; `cut_tuner()` drops that traffic (and only that) with nftables.
- **Processes** run in a namespace through `ip netns exec`, each in its own process group, and are
  killed (the whole group) before the namespaces go.
"""

from __future__ import annotations

import fcntl
import itertools
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from processes import kill_group

ROOT = Path(__file__).resolve().parents[1]
WIRE = Path(__file__).resolve().parent / "netns_wire.py"
PREFIX = "tf-"
_instances = itertools.count()


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and proc.returncode:
        raise RuntimeError(f"`ip {' '.join(args)}` failed: {proc.stderr.strip()}")
    return proc


def nft(namespace: str, ruleset: str) -> None:
    proc = subprocess.run(["ip", "netns", "exec", namespace, "nft", "-f", "-"], input=ruleset,
                          capture_output=True, text=True, timeout=30)
    if proc.returncode:
        raise RuntimeError(f"nft in {namespace} failed: {proc.stderr.strip()}\n{ruleset}")


def unavailable() -> str:
    """Why this machine cannot make namespaces for the tests ("" when it can)."""
    if not sys.platform.startswith("linux"):
        return "network namespaces are a Linux feature"
    if os.geteuid() != 0:
        return "creating network namespaces (ip netns add) needs root"
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed"
    if not os.path.exists("/dev/net/tun"):
        return "/dev/net/tun is missing (the agents' links are TUN devices)"
    probe = f"{PREFIX}{os.getpid()}-probe"
    made = ip("netns", "add", probe, check=False)
    if made.returncode:
        return f"`ip netns add` does not work here: {made.stderr.strip()}"
    ip("netns", "del", probe, check=False)
    return ""


def missing_tools() -> str:
    """Tools the tests need once namespaces work; their absence is a failure, not a skip."""
    if shutil.which("nft") is None:
        return "the `nft` command is missing: apt-get install -y nftables (see the README's test command)"
    if shutil.which("openssl") is None:
        return "the `openssl` command is missing (it makes the tracker's test certificate): apt-get install -y openssl"
    return ""


def make_certificate(directory: Path, name: str, ip_address: str) -> tuple:
    """(certificate, key) PEM files of a new self-signed certificate for `ip_address`.

    Self-signed, so the certificate is its own CA: an agent or tuner given it as --tls-ca trusts
    this tracker, and one given another such certificate does not.
    """
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    proc = subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                           "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "2",
                           "-subj", f"/CN=tunefarm test tracker {name}", "-addext", f"subjectAltName=IP:{ip_address}"],
                          capture_output=True, text=True, timeout=60)
    if proc.returncode:
        raise RuntimeError(f"openssl could not make a certificate: {proc.stderr.strip()}")
    return cert, key


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale() -> list:
    """Delete namespaces a killed test run left behind (their pid is gone); the names deleted."""
    gone = []
    for line in ip("netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        m = re.match(rf"^{PREFIX}(\d+)-", name)
        if m and int(m.group(1)) != os.getpid() and not _pid_alive(int(m.group(1))):
            ip("netns", "del", name, check=False)
            gone.append(name)
    return gone


CONSOLE_LOCK = Path("/tmp/tunefarm-netns-console.lock")   # one test process picks and takes a subnet at a time


def _free_console_subnet() -> int:
    """A third octet for the console's /24 that no address of the root namespace uses yet."""
    used = ip("-4", "-o", "addr", "show", check=False).stdout
    for third in range(200, 250):
        if f" 10.213.{third}." not in used:
            return third
    raise RuntimeError("no free 10.213.200-249.0/24 subnet for the console link")


ONE_WAY = """
table inet tunefarm_one_way {
    chain inbound {
        type filter hook input priority 0; policy drop;
        iifname "lo" accept
        ct state established,related accept
    }
}
"""


class Hosts:
    """A service namespace and `n_agents` agent namespaces behind delayed, lossy, one-way links."""

    TRACKER_PORT = 9190  # the service namespace is new and ours: every port in it is free

    def __init__(self, n_agents: int, delay_ms: float = 50.0, loss: float = 0.02, log_dir: Path | None = None):
        self.tag = f"{os.getpid()}-{next(_instances)}"
        self.service = f"{PREFIX}{self.tag}-svc"
        self.agents = [f"{PREFIX}{self.tag}-a{i}" for i in range(n_agents)]
        short = self.tag.replace("-", "n")
        self._console = (f"tf{short}c", f"tf{short}C")          # root side, service side
        self._links = [(f"tf{short}h{i}", f"tf{short}a{i}") for i in range(n_agents)]  # service side, agent side
        self.log_dir = log_dir or Path("/tmp")
        self._procs: list = []
        self._wire = None
        self._tuner_cut = False
        try:
            self._build(delay_ms, loss)
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ building
    def _build(self, delay_ms: float, loss: float) -> None:
        for ns in [self.service, *self.agents]:
            ip("netns", "add", ns)
            ip("-n", ns, "link", "set", "lo", "up")
        root_end, svc_end = self._console
        # picked and taken under a lock: the suite's two processes (-n 2) may build farms at once
        with open(CONSOLE_LOCK, "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            third = _free_console_subnet()
            self.console_ip, self.tracker_ip = f"10.213.{third}.1", f"10.213.{third}.2"
            ip("link", "add", root_end, "type", "veth", "peer", "name", svc_end, "netns", self.service)
            ip("addr", "add", f"{self.console_ip}/24", "dev", root_end)
        ip("link", "set", root_end, "up")
        ip("-n", self.service, "addr", "add", f"{self.tracker_ip}/24", "dev", svc_end)
        ip("-n", self.service, "link", "set", svc_end, "up")
        if not self.agents:
            return
        self._wire = subprocess.Popen(
            [sys.executable, str(WIRE), "--delay-ms", str(delay_ms), "--loss", str(loss),
             *(f"{a}:{b}" for a, b in self._links)],
            stdout=subprocess.PIPE, stderr=open(self.log_dir / f"wire-{self.tag}.log", "wb"), text=True)
        ready = self._wire.stdout.readline()
        if not ready.startswith("ready"):
            raise RuntimeError(f"the link process did not start (see {self.log_dir}/wire-{self.tag}.log)")
        self.wire_seed = ready.strip()
        for i, (ns, (svc_dev, agent_dev)) in enumerate(zip(self.agents, self._links)):
            svc_ip, agent_ip = self.link_ips(i)
            ip("link", "set", svc_dev, "netns", self.service)
            ip("link", "set", agent_dev, "netns", ns)
            ip("-n", self.service, "addr", "add", svc_ip, "peer", agent_ip, "dev", svc_dev)
            ip("-n", ns, "addr", "add", agent_ip, "peer", svc_ip, "dev", agent_dev)
            ip("-n", self.service, "link", "set", svc_dev, "up")
            ip("-n", ns, "link", "set", agent_dev, "up")
            ip("-n", ns, "route", "add", "default", "dev", agent_dev)
            nft(ns, ONE_WAY)

    @staticmethod
    def link_ips(i: int) -> tuple:
        """(service side, agent side) addresses of agent i's link."""
        return f"10.213.{10 + i}.1", f"10.213.{10 + i}.2"

    @property
    def tracker_address(self) -> str:
        return f"{self.tracker_ip}:{self.TRACKER_PORT}"

    # ------------------------------------------------------------------ processes
    def spawn(self, namespace: str, cmd: list, log: Path, env: dict | None = None) -> subprocess.Popen:
        """`cmd` inside `namespace`, in its own process group, output to `log`."""
        full_env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
        with open(log, "wb") as out:
            proc = subprocess.Popen(["ip", "netns", "exec", namespace, *cmd], cwd=ROOT, env=full_env, stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        self._procs.append(proc)
        return proc

    def run(self, namespace: str, cmd: list, timeout: float = 60, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(["ip", "netns", "exec", namespace, *cmd], cwd=ROOT, capture_output=True, text=True,
                              timeout=timeout, **kw)

    # ------------------------------------------------------------------ faults
    def cut_agent(self, i: int) -> None:
        """Agent i's link goes dead at the service end: nothing passes either way, nobody is told."""
        ip("-n", self.service, "link", "set", self._links[i][0], "down")

    def restore_agent(self, i: int) -> None:
        ip("-n", self.service, "link", "set", self._links[i][0], "up")

    def cut_tuner(self) -> None:
        """Drop every packet between the tuner and the tracker (the service namespace's loopback)."""
        port = self.TRACKER_PORT
        nft(self.service, f"""
table inet tunefarm_cut {{
    chain inbound {{
        type filter hook input priority 0; policy accept;
        iifname "lo" tcp dport {port} drop
        iifname "lo" tcp sport {port} drop
    }}
}}
""")
        self._tuner_cut = True

    def restore_tuner(self) -> None:
        if self._tuner_cut:
            nft(self.service, "delete table inet tunefarm_cut\n")
            self._tuner_cut = False

    # ------------------------------------------------------------------ teardown
    def close(self) -> None:
        """Kill every process started here, the links, and the namespaces (safe to call twice)."""
        for proc in self._procs:
            kill_group(proc)
        self._procs.clear()
        if self._wire is not None:
            self._wire.terminate()
            try:
                self._wire.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._wire.kill()
                self._wire.wait(timeout=10)
            self._wire = None
        for ns in [*self.agents, self.service]:
            ip("netns", "del", ns, check=False)
        ip("link", "del", self._console[0], check=False)  # gone with the service namespace already

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
