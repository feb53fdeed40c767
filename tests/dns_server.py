"""A real DNS server on loopback for discovery tests: Debian's dnsmasq on a free high port.

Address records come from a hosts file that ``set_hosts`` rewrites and reloads with SIGHUP
(dnsmasq re-reads --addn-hosts files on SIGHUP); SRV records are configuration, which
dnsmasq reads only at start, so ``set_srv`` restarts it on the same port. The process is
tracked by its pid and stopped by it.
"""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import socket
import subprocess
import time

import dns.nameserver
import dns.resolver


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class DnsServer:
    def __init__(self, workdir: str, domain: str = "test") -> None:
        self.dir = workdir
        self.domain = domain
        self.port = free_udp_port()
        self.hosts_path = os.path.join(workdir, "hosts")
        self.conf_path = os.path.join(workdir, "dnsmasq.conf")
        self.log_path = os.path.join(workdir, "dnsmasq.log")
        self.proc: subprocess.Popen | None = None
        self.srv: list[tuple[str, str, int]] = []
        self.hosts: dict[str, list[str]] = {}
        self._write_hosts()

    @staticmethod
    def available() -> bool:
        return shutil.which("dnsmasq") is not None

    @property
    def nameserver(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _write_hosts(self) -> None:
        tmp = self.hosts_path + ".tmp"
        with open(tmp, "w") as f:
            for name, addrs in self.hosts.items():
                for a in addrs:
                    f.write(f"{a} {name}\n")
        os.replace(tmp, self.hosts_path)

    def _write_conf(self) -> None:
        lines = [f"port={self.port}", "listen-address=127.0.0.1", "bind-interfaces", "no-resolv", "no-hosts",
                 "keep-in-foreground", f"addn-hosts={self.hosts_path}", f"local=/{self.domain}/",
                 "cache-size=0", "log-queries", f"log-facility={self.log_path}",
                 # keep our user, so the reload after SIGHUP can read the test's private directory
                 f"user={getpass.getuser()}"]
        lines += [f"srv-host={name},{target},{port}" for name, target, port in self.srv]
        with open(self.conf_path, "w") as f:
            f.write("\n".join(lines) + "\n")

    def start(self) -> "DnsServer":
        self._write_hosts()
        self._write_conf()
        self.proc = subprocess.Popen(["dnsmasq", f"--conf-file={self.conf_path}"], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        self._wait_answering()
        return self

    def _wait_answering(self, timeout: float = 10.0) -> None:
        r = dns.resolver.Resolver(configure=False)
        r.nameservers = [dns.nameserver.Do53Nameserver("127.0.0.1", self.port)]
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"dnsmasq exited with {self.proc.returncode}: {self.log()}")
            try:
                r.resolve(f"probe.{self.domain}", "A", lifetime=0.3)
                return
            except dns.resolver.NXDOMAIN:
                return          # it answers
            except Exception:
                time.sleep(0.05)
        raise RuntimeError(f"dnsmasq did not answer on port {self.port}: {self.log()}")

    def log(self) -> str:
        try:
            with open(self.log_path) as f:
                return f.read()[-4000:]
        except OSError:
            return ""

    def set_hosts(self, hosts: dict[str, list[str]]) -> None:
        """Replace the address records and reload them (SIGHUP)."""
        self.hosts = {k: list(v) for k, v in hosts.items()}
        self._write_hosts()
        assert self.proc is not None and self.proc.poll() is None
        os.kill(self.proc.pid, signal.SIGHUP)

    def set_srv(self, records: list[tuple[str, str, int]]) -> None:
        """Replace the SRV records (name, target, port): dnsmasq restarts on the same port."""
        self.srv = list(records)
        self.stop()
        self.start()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        self.proc = None
