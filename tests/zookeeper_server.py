"""A real standalone ZooKeeper server for tests, from Debian's `zookeeper` package.

Owns starting `org.apache.zookeeper.server.ZooKeeperServerMain` on 127.0.0.1 and a free port
with a temporary data directory and a small tick time, waiting until the four-letter command
`srvr` says `Mode: standalone` (`ruok` answers too early: a client connecting then can stall for
its whole session timeout), and stopping it (SIGTERM, then SIGKILL). Does not own any client:
tests connect with `scheduler.zk` or kazoo. Install with `apt-get install -y zookeeper`.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
from pathlib import Path

from testkit.waiting import poll

JARS = ("/usr/share/java/zookeeper.jar", "/usr/share/java/slf4j-simple.jar")
MAIN = "org.apache.zookeeper.server.ZooKeeperServerMain"


class ZooKeeperUnavailable(RuntimeError):
    """Java or Debian's ZooKeeper jars are missing, or the server did not come up."""


def missing() -> str | None:
    """Why a ZooKeeper server cannot be started here, or None when it can."""
    if shutil.which("java") is None:
        return "no java on PATH"
    absent = [j for j in JARS if not os.path.exists(j)]
    if absent:
        return f"missing {', '.join(absent)} (apt-get install -y zookeeper)"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def four_letter(port: int, word: str, timeout: float = 1.0) -> str:
    """Send a four-letter command and return the whole answer ("" if none)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(word.encode("ascii"))
            chunks = []
            for _ in range(64):  # bounded: answers are a few hundred bytes
                data = s.recv(4096)
                if not data:
                    break
                chunks.append(data)
            return b"".join(chunks).decode("utf-8", errors="replace")
    except OSError:
        return ""


class ZooKeeperServer:
    """`with ZooKeeperServer(tmp_path) as zk: zk.hosts` -> "127.0.0.1:PORT"."""

    def __init__(self, work_dir: Path, tick_ms: int = 200, start_timeout: float = 20.0):
        self.work_dir = Path(work_dir).resolve()
        self.tick_ms = tick_ms
        self.start_timeout = start_timeout
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def hosts(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def max_session_timeout(self) -> float:
        """ZooKeeper clamps session timeouts to [2, 20] x tickTime."""
        return 20 * self.tick_ms / 1000.0

    def start(self) -> "ZooKeeperServer":
        why = missing()
        if why:
            raise ZooKeeperUnavailable(why)
        for _ in range(3):  # another process may take the free port before Java binds it
            self.port = free_port()
            self.process = self._spawn(self._write_config())
            if self._wait_ready():
                return self
            self.stop()
        raise ZooKeeperUnavailable(f"ZooKeeper did not report Mode: standalone; see "
                                   f"{self.work_dir / 'zookeeper.log'}")

    def _write_config(self) -> Path:
        data = self.work_dir / f"data-{self.port}"
        data.mkdir(parents=True, exist_ok=True)
        cfg = self.work_dir / f"zoo-{self.port}.cfg"
        cfg.write_text(
            f"tickTime={self.tick_ms}\ndataDir={data}\nclientPort={self.port}\n"
            "clientPortAddress=127.0.0.1\nadmin.enableServer=false\n"
            "4lw.commands.whitelist=ruok,srvr,stat,mntr\nmaxClientCnxns=100\n")
        return cfg

    def _spawn(self, cfg: Path) -> "subprocess.Popen[bytes]":
        log = open(self.work_dir / "zookeeper.log", "ab")
        try:
            return subprocess.Popen(
                ["java", "-Xmx128m", "-XX:+UseSerialGC", "-cp", ":".join(JARS), MAIN, str(cfg)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        finally:
            log.close()

    def _wait_ready(self) -> bool:
        def settled() -> str:
            if self.process is None or self.process.poll() is not None:
                return "ended"
            return "ready" if "Mode: standalone" in four_letter(self.port, "srvr",
                                                                timeout=0.5) else ""

        return bool(poll(settled, self.start_timeout, 0.05) == "ready")

    def stop(self) -> None:
        p, self.process = self.process, None
        if p is None or p.poll() is not None:
            return
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)

    def __enter__(self) -> "ZooKeeperServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
