"""Shapers for one node of a several-host run (testbed.hosts.node): each node shapes only its own links out.

    none    the real network as is: a node dials its peers' addresses directly (the scenario's hops become
            what was expected; the run reports what it measured)
    relay   the userspace relay (netem.userspace) for this node's links out: the agent dials a local relay
            that forwards to the peer's host after the link's delay
    egress  kernel netem on this host's interface: one netem per peer, selected by destination address and
            port (netem.egress), so only the data plane is shaped; needs root and sch_netem

On one box the launcher builds one shaper for every link; on several hosts every node builds one of these for
the links whose source is its own stage, and the peer addresses are the other hosts'.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import trio

from netem.base import Shaper, ShaperOptions
from testbed.core.channel import LineReader, encode_line
from testbed.core.errors import ShapingError
from testbed.core.records import Address, LinkSpec

KINDS = ("none", "relay", "egress")
KEEPER_TIMEOUT_S = 30.0


class DirectShaper(Shaper):
    """No shaping: every link is the real network between the hosts."""

    name = "none"

    async def connect(self, listen: dict[int, Address]) -> dict[tuple[int, int], Address]:
        return {(link.src, link.dst): listen[link.dst] for link in self.links}

    def plan_lines(self) -> list[str]:
        return [f"direct {link.name}: the real network, unshaped (expected {link.delay_ms:g} ms)"
                for link in self.links]

    async def aclose(self) -> None:
        pass


class EgressShaper(Shaper):
    """Kernel netem on `iface` for each link out of this node, by destination address and port (netem.egress).

    The qdiscs are held by a keeper child process (`python -m netem.hostnet`): it applies them, then removes
    them when told to or when its stdin closes, so a node killed with SIGKILL leaves no qdisc behind either.
    """

    name = "egress"

    def __init__(self, links: list[LinkSpec], n_stages: int, run_id: str, options: ShaperOptions | None = None,
                 *, iface: str) -> None:
        super().__init__(links, n_stages, run_id, options)
        self.iface = iface
        self._keeper: trio.Process | None = None
        self._applied: list[str] = []

    async def connect(self, listen: dict[int, Address]) -> dict[tuple[int, int], Address]:
        request = {"iface": self.iface, "run_id": self.run_id,
                   "peers": [[vars(link), listen[link.dst][0], listen[link.dst][1]] for link in self.links]}
        self._keeper = await trio.lowlevel.open_process(
            [sys.executable, "-m", "netem.hostnet"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            process_group=0)  # Ctrl-C reaches the node only, which closes us
        assert self._keeper.stdin is not None and self._keeper.stdout is not None
        await self._keeper.stdin.send_all(encode_line(request))
        with trio.fail_after(KEEPER_TIMEOUT_S):
            answer = await LineReader(self._keeper.stdout).receive_json()
        if answer is None or "error" in answer:
            raise ShapingError(answer["error"] if answer else
                               f"the egress keeper exited during setup (status {await self._keeper.wait()})")
        self._applied = answer["applied"]
        return {(link.src, link.dst): listen[link.dst] for link in self.links}

    def plan_lines(self) -> list[str]:
        return [f"egress {self.iface} -> stage {link.dst}: netem delay {link.delay_ms:g} ms jitter "
                f"{link.jitter_ms:g} ms loss {link.loss_pct:g}% rate {link.rate_mbit:g} Mbit/s" for link in self.links]

    def describe(self) -> dict:
        return {**super().describe(), "iface": self.iface, "applied": self._applied}

    async def aclose(self) -> None:
        keeper, self._keeper = self._keeper, None
        if keeper is None:
            return
        with trio.CancelScope(shield=True):
            if keeper.stdin is not None:
                await trio.aclose_forcefully(keeper.stdin)  # EOF: the keeper removes the qdiscs and exits
            with trio.move_on_after(KEEPER_TIMEOUT_S):
                await keeper.wait()
            if keeper.returncode is None:
                keeper.kill()
                await keeper.wait()


def keeper_main() -> int:
    """The egress keeper: one JSON request on stdin, the qdiscs applied, removed at stdin's EOF (or death)."""
    from netem.egress import EgressShaper as Egress

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the node decides when we stop (it closes our stdin)
    request = json.loads(sys.stdin.readline() or "{}")
    egress = Egress(request["iface"], request["run_id"])
    try:
        try:
            egress.apply([(LinkSpec(**link), ip, port) for link, ip, port in request["peers"]])
        except ShapingError as exc:
            print(json.dumps({"error": str(exc)}), flush=True)
            return 1
        print(json.dumps({"applied": list(egress.describe())}), flush=True)
        while sys.stdin.readline():
            pass
        return 0
    finally:
        egress.close()


def node_shaper(kind: str, links: list[LinkSpec], n_stages: int, run_id: str, *, iface: str | None = None,
                options: ShaperOptions | None = None) -> Shaper:
    """The shaper for one node's links out (every link's src is this node's stage)."""
    if kind in ("none", "egress") and options is not None and options.schedule:
        raise ShapingError(f"--shape {kind} does not follow a [[network.schedule]] across hosts: use --shape relay")
    if kind == "none":
        shaper: Shaper = DirectShaper(links, n_stages, run_id, options)
        shaper.reason = "none: the real network between the hosts, measured as is"
    elif kind == "relay":
        from netem.userspace import UserspaceShaper

        shaper = UserspaceShaper(links, n_stages, run_id, options)
        shaper.reason = "relay: this node's links out through the userspace relay"
    elif kind == "egress":
        if not iface:
            raise ShapingError("--shape egress shapes one interface's egress: name it with --iface")
        shaper = EgressShaper(links, n_stages, run_id, options, iface=iface)
        shaper.reason = f"egress: kernel netem on {iface}, one per peer (destination address and port)"
    else:
        raise ShapingError(f"unknown --shape {kind!r}; valid: {', '.join(KINDS)}")
    return shaper


if __name__ == "__main__":
    sys.exit(keeper_main())
