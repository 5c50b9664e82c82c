"""Simulated regions on one Linux machine: a network namespace per region, joined to the host's
namespace (where the broker and the trainers run) by a veth pair, with a rate limit on the veth
and a link proxy (`astraflow.net.linkproxy`) for delay, jitter and loss.

Inside a region, the proxy listens on the region's own 127.0.0.1 at the same ports as the services
it fronts, and forwards across the veth to the host side's address:

    region namespace                         veth (tbf rate)          host namespace
    worker -> 127.0.0.1:KP  -> linkproxy ------------------------> 10.a.b.1:KP  Kafka region listener
    worker -> 127.0.0.1:HP  -> linkproxy ------------------------> 10.a.b.1:HP  weight server

So the addresses everyone is told (Kafka's advertised listener for the region, the http:// URIs in
WeightVersion events) name 127.0.0.1, and inside the region that is the proxy: a region's client
cannot bypass the link. A partition takes the host end of the veth down, so the kernel's TCP
(not the proxy) sees it and backs off as it would on a real link.

Needs root (CAP_NET_ADMIN) and the `ip` and `tc` tools. Every name carries a random tag so parallel
runs never collide, and `Region.close` (also on failure) deletes the namespace, which deletes the
veth pair with it, and stops every process started in it.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from astraflow.errors import AstraFlowError
from astraflow.net.linkproxy import Link

SUBNETS = ipaddress.IPv4Network("10.213.0.0/16")


class NetnsError(AstraFlowError):
    """A simulated region could not be made (no root, no `ip`, no netns support in the kernel)."""


def _ip(*args: str, ns: str | None = None) -> str:
    cmd = ["ip", *(["netns", "exec", ns, "ip"] if ns else []), *args]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise NetnsError(f"`{' '.join(cmd)}` failed: {result.stderr.strip() or result.stdout.strip()}")
    return result.stdout


def _tc(*args: str, ns: str | None = None) -> None:
    cmd = [*(["ip", "netns", "exec", ns] if ns else []), "tc", *args]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise NetnsError(f"`{' '.join(cmd)}` failed: {result.stderr.strip()}")


def check_support() -> None:
    """Raise NetnsError saying why simulated regions cannot be made here."""
    if os.geteuid() != 0:
        raise NetnsError(
            f"simulated regions need root (network namespaces, veth, tc); running as uid {os.geteuid()}"
        )
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            raise NetnsError(f"simulated regions need the `{tool}` tool (iproute2); it is not on PATH")


def _free_subnet() -> ipaddress.IPv4Network:
    """A /30 in 10.213.0.0/16 that no interface of the host uses yet."""
    used = _ip("-4", "-o", "addr", "show")
    candidates = list(SUBNETS.subnets(new_prefix=30))
    for _ in range(200):
        net = random.choice(candidates)
        if str(net.network_address + 1) + "/" not in used and str(net.network_address + 2) + "/" not in used:
            return net
    raise NetnsError("no free /30 left in 10.213.0.0/16")


@dataclass
class Region:
    """One simulated region; use `Region.create(...)` as a context manager."""

    name: str
    link: Link
    rate_mbit: float | None
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:6])
    subnet: ipaddress.IPv4Network | None = None
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    made: bool = False

    @property
    def netns(self) -> str:
        return f"af-{self.name}-{self.tag}"

    @property
    def host_if(self) -> str:
        return f"afh{self.tag}"  # interface names are at most 15 characters

    @property
    def region_if(self) -> str:
        return f"afr{self.tag}"

    @property
    def host_ip(self) -> str:
        assert self.subnet is not None
        return str(self.subnet.network_address + 1)

    @property
    def region_ip(self) -> str:
        assert self.subnet is not None
        return str(self.subnet.network_address + 2)

    @classmethod
    @contextlib.contextmanager
    def create(cls, name: str, link: Link, rate_mbit: float | None = 100.0) -> Iterator[Region]:
        region = cls(name=name, link=link, rate_mbit=rate_mbit)
        try:
            region.up()
            yield region
        finally:
            region.close()

    def up(self) -> None:
        check_support()
        self.subnet = _free_subnet()
        _ip("netns", "add", self.netns)
        self.made = True
        _ip("link", "add", self.host_if, "type", "veth", "peer", "name", self.region_if)
        _ip("link", "set", self.region_if, "netns", self.netns)
        _ip("addr", "add", f"{self.host_ip}/30", "dev", self.host_if)
        _ip("link", "set", self.host_if, "up")
        _ip("addr", "add", f"{self.region_ip}/30", "dev", self.region_if, ns=self.netns)
        _ip("link", "set", self.region_if, "up", ns=self.netns)
        _ip("link", "set", "lo", "up", ns=self.netns)
        if self.rate_mbit:
            # egress of each end: the host end shapes traffic into the region, the region end out of it
            spec = ["root", "tbf", "rate", f"{self.rate_mbit}mbit", "burst", "64kb", "latency", "400ms"]
            _tc("qdisc", "add", "dev", self.host_if, *spec)
            _tc("qdisc", "add", "dev", self.region_if, *spec, ns=self.netns)

    def popen(
        self, argv: list[str], env: dict[str, str] | None = None, log: Path | None = None
    ) -> subprocess.Popen[bytes]:
        """Start a process inside the region (stopped by `close`)."""
        out = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115 - handed to the child
        proc = subprocess.Popen(
            ["ip", "netns", "exec", self.netns, *argv],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.procs.append(proc)
        return proc

    def start_proxy(
        self, ports: list[int], stats: Path, log: Path | None = None, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        """The region's link proxy: 127.0.0.1:P in the region -> host side P, for each port."""
        routes = [a for p in ports for a in ("--route", f"127.0.0.1:{p}={self.host_ip}:{p}")]
        proc = self.popen(
            [
                sys.executable,
                "-m",
                "astraflow.net.linkproxy",
                *routes,
                "--delay-ms",
                str(self.link.delay_ms),
                "--jitter-ms",
                str(self.link.jitter_ms),
                "--loss",
                str(self.link.loss),
                "--stats",
                str(stats),
            ],
            env=env,
            log=log,
        )
        deadline = time.monotonic() + 60
        while not stats.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise NetnsError(
                    f"the link proxy of region {self.name} did not start (status {proc.poll()}); log: {log}"
                )
            time.sleep(0.1)
        return proc

    def partition(self) -> None:
        """Cut the region off: the host end of the veth goes down; packets are lost both ways."""
        _ip("link", "set", self.host_if, "down")

    def heal(self) -> None:
        _ip("link", "set", self.host_if, "up")
        # taking the link down removed the host's route to the region; it comes back with the address
        if self.subnet is not None and str(self.subnet) not in _ip(
            "-4", "route", "show", "dev", self.host_if
        ):
            _ip("route", "add", str(self.subnet), "dev", self.host_if)

    def stop(self, proc: subprocess.Popen[bytes], timeout: float = 20.0) -> int | None:
        """SIGTERM the process group of one of our processes, then SIGKILL; returns its status."""
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        return proc.returncode

    def close(self) -> None:
        for proc in reversed(self.procs):
            self.stop(proc)
        self.procs.clear()
        if self.made:
            # deleting the namespace deletes the region's veth end, and with it the host end
            subprocess.run(["ip", "netns", "del", self.netns], capture_output=True)
            self.made = False
        subprocess.run(["ip", "link", "del", self.host_if], capture_output=True)
