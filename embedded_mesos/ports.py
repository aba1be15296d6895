"""Port bands for embedded agents on a machine other programs (and other Elastiq runs) share.

Owns `claim_band`: a band of consecutive ports that can all be bound on 127.0.0.1 right now,
outside the kernel's ephemeral range (where outgoing connections take ports at any time), and
claimed for as long as the returned `PortClaim` lives: its first port is held by a listening
socket, so a second run looking for a band sees it taken and moves on (the kernel decides who
wins, so two runs starting at the same instant still get different bands). The agent offers
the band without that first port. A port some other program binds later is not prevented: the
scheduler relaunches a task that could not bind its port on another one. The probing is
`port_bindable`; which bands are tried is the pure `candidate_bands`.
"""

from __future__ import annotations

import logging
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

log = logging.getLogger(__name__)

SEARCH_LOW, SEARCH_HIGH = 20000, 60999  # where bands are looked for
EPHEMERAL_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
DEFAULT_EPHEMERAL = (32768, 60999)  # Linux's default, when the file cannot be read


class NoFreeBand(RuntimeError):
    """No band of the wanted width could be bound and claimed."""


@dataclass
class PortClaim:
    """A claimed band `low..high` (both offered); the port below `low` is held as the claim."""

    low: int
    high: int
    _marker: socket.socket = field(repr=False)

    @property
    def ports(self) -> str:
        """The band as an agent's `ports` resource, e.g. "31001-31199"."""
        return f"{self.low}-{self.high}"

    def release(self) -> None:
        self._marker.close()


def ephemeral_range(path: Path = EPHEMERAL_FILE) -> tuple[int, int]:
    """The kernel's ephemeral port range (Linux's default when it cannot be read)."""
    try:
        low, high = (int(x) for x in path.read_text().split()[:2])
        return low, high
    except (OSError, ValueError):
        return DEFAULT_EPHEMERAL


def candidate_bands(width: int, ephemeral: tuple[int, int], low: int = SEARCH_LOW,
                    high: int = SEARCH_HIGH) -> Iterator[tuple[int, int]]:
    """Bands `width` wide (claim port included) from `low` up, skipping any that touch the
    ephemeral range (pure)."""
    first = low
    while first + width - 1 <= high:
        last = first + width - 1
        if last < ephemeral[0] or first > ephemeral[1]:
            yield first, last
        first += width


def port_bindable(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a listening socket could bind `host:port` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _hold(port: int, host: str) -> socket.socket | None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((host, port))
        sock.listen(1)
    except OSError:
        sock.close()
        return None
    return sock


def claim_band(ports: int, host: str = "127.0.0.1",
               probe: Callable[[int], bool] = port_bindable,
               ephemeral: tuple[int, int] | None = None) -> PortClaim:
    """Claim the first band of `ports` offerable ports (plus the claim port) that is free.
    NoFreeBand when none is."""
    width = ports + 1
    tried = 0
    for first, last in candidate_bands(width, ephemeral or ephemeral_range()):
        tried += 1
        marker = _hold(first, host)
        if marker is None:
            continue  # claimed by another run, or simply in use
        if all(probe(p) for p in range(first + 1, last + 1)):
            log.info("claimed ports %s-%s (claim held on %s)", first + 1, last, first)
            return PortClaim(first + 1, last, marker)
        marker.close()
    raise NoFreeBand(f"no band of {ports} free ports on {host} (tried {tried} bands between "
                     f"{SEARCH_LOW} and {SEARCH_HIGH}, outside the ephemeral range)")
