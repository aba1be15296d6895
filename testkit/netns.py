"""Network namespaces as separate hosts on this machine, for tests and benchmarks that cut a
host off the network (a partition: packets are dropped, nothing is reset).

Owns `NetnsNetwork`: a private "network" made of a bridge inside a namespace of its own, one
namespace per simulated host joined to the bridge by a veth pair, and one veth whose host end
carries the first address (so processes in the caller's own namespace, such as an in-process
master, scheduler or Spark task, are reachable); `cut(host)` and `restore(host)` take a host's
bridge port down and up. Addresses come from a 10.231.N.0/24 that exists only on these veths and
is routed nowhere. Also owns `netns_unavailable()`, the reason to skip when the kernel or the
user cannot create namespaces. Everything it creates is torn down by `close()` (also on failure
half-way through `create()`). It owns no product behaviour, and no process started inside a
namespace (tests/netns_support.py's agents, testkit/dpc_netns.py's sources).
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Sequence

log = logging.getLogger("testkit.netns")
IP_TIMEOUT = 10.0


class NetnsError(RuntimeError):
    """An `ip` command failed; the message carries the command and its stderr."""


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run `ip ARGS` (bounded in time); raise NetnsError with its stderr when `check`."""
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=IP_TIMEOUT)
    if check and done.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: exit {done.returncode}: {done.stderr.strip()}")
    return done


def netns_unavailable() -> str | None:
    """None when namespaces and veth pairs can be created here, else why not (a skip reason)."""
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed (apt-get install -y iproute2)"
    probe = f"elqprobe{os.getpid() % 100000}"
    try:
        ip("netns", "add", probe)
    except (NetnsError, subprocess.TimeoutExpired) as exc:
        return f"cannot create a network namespace here (needs root/CAP_SYS_ADMIN): {exc}"
    try:
        ip("-n", probe, "link", "add", "v0", "type", "veth", "peer", "name", "v1")
    except (NetnsError, subprocess.TimeoutExpired) as exc:
        return f"cannot create a veth pair in a namespace here: {exc}"
    finally:
        ip("netns", "del", probe, check=False)
    return None


def _free_subnet() -> int:
    """A third octet N such that no interface here has an address in 10.231.N.0/24."""
    used = ip("-4", "-o", "addr", "show").stdout
    start = 20 + os.getpid() % 200
    for step in range(230):
        octet = 20 + (start - 20 + step) % 230
        if f"10.231.{octet}." not in used:
            return octet
    raise NetnsError("no free 10.231.N.0/24 on this machine")


@dataclass
class NetnsNetwork:
    """Hosts in their own namespaces on a bridge; the test's own namespace is `host_address`."""

    hosts: Sequence[str]  # short names, e.g. ("a", "b")
    prefix: str = field(default_factory=lambda: f"elq{os.getpid() % 100000:05d}")
    octet: int = 0
    created_ns: list[str] = field(default_factory=list)
    created_links: list[str] = field(default_factory=list)

    @property
    def bridge_ns(self) -> str:
        return f"{self.prefix}br"

    @property
    def host_address(self) -> str:
        """The address of the test's own namespace (the host end of the uplink veth)."""
        return f"10.231.{self.octet}.1"

    def namespace(self, host: str) -> str:
        return f"{self.prefix}{host}"

    def address(self, host: str) -> str:
        return f"10.231.{self.octet}.{2 + list(self.hosts).index(host)}"

    def _port(self, host: str) -> str:
        """The bridge-side veth of `host` (taking it down cuts the host off)."""
        return f"{self.prefix}{host}p"

    def create(self) -> "NetnsNetwork":
        try:
            self.octet = _free_subnet()
            self._add_ns(self.bridge_ns)
            ip("-n", self.bridge_ns, "link", "add", "br0", "type", "bridge")
            ip("-n", self.bridge_ns, "link", "set", "br0", "up")
            self._uplink()
            for host in self.hosts:
                self._add_host(host)
        except BaseException:
            self.close()
            raise
        log.info("netns %s: bridge %s, host end %s, hosts %s", self.prefix, self.bridge_ns,
                 self.host_address, {h: self.address(h) for h in self.hosts})
        return self

    def _add_ns(self, name: str) -> None:
        ip("netns", "add", name)
        self.created_ns.append(name)
        ip("-n", name, "link", "set", "lo", "up")

    def _uplink(self) -> None:
        """A veth from the test's namespace (address .1) to the bridge."""
        outer, inner = f"{self.prefix}h", f"{self.prefix}hp"
        ip("link", "add", outer, "type", "veth", "peer", "name", inner, "netns", self.bridge_ns)
        self.created_links.append(outer)
        ip("addr", "add", f"{self.host_address}/24", "dev", outer)
        ip("link", "set", outer, "up")
        self._join_bridge(inner)

    def _add_host(self, host: str) -> None:
        ns, port = self.namespace(host), self._port(host)
        self._add_ns(ns)
        ip("-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", port,
           "netns", self.bridge_ns)
        ip("-n", ns, "addr", "add", f"{self.address(host)}/24", "dev", "eth0")
        ip("-n", ns, "link", "set", "eth0", "up")
        self._join_bridge(port)

    def _join_bridge(self, port: str) -> None:
        ip("-n", self.bridge_ns, "link", "set", port, "master", "br0")
        ip("-n", self.bridge_ns, "link", "set", port, "up")

    def cut(self, host: str) -> None:
        """Take the host's bridge port down: nothing reaches it, it reaches nothing."""
        ip("-n", self.bridge_ns, "link", "set", self._port(host), "down")
        log.info("netns %s: host %s (%s) cut off", self.prefix, host, self.address(host))

    def restore(self, host: str) -> None:
        ip("-n", self.bridge_ns, "link", "set", self._port(host), "up")
        log.info("netns %s: host %s (%s) back on the network", self.prefix, host,
                 self.address(host))

    def exec_argv(self, host: str, argv: Sequence[str]) -> list[str]:
        """argv that runs `argv` inside `host`'s namespace (`ip netns exec` execs it, so the
        pid is the command's own)."""
        return ["ip", "netns", "exec", self.namespace(host), *argv]

    def close(self) -> None:
        """Delete every link and namespace this network created; idempotent. End the processes
        running inside first (a namespace with processes in it outlives `ip netns del`)."""
        for link in reversed(self.created_links):
            ip("link", "del", link, check=False)
        for ns in reversed(self.created_ns):
            ip("netns", "del", ns, check=False)
        self.created_links.clear()
        self.created_ns.clear()

    def leftovers(self) -> list[str]:
        """Namespaces of this network still present (for an honest teardown check)."""
        names = ip("netns", "list", check=False).stdout.split()
        return [n for n in names if n.startswith(self.prefix)]
