"""The probe between separate hosts (testbed.hosts.probe, testbed.studies.probe.remote).

Exact: the far end's frames read in any pieces; one-way times from another clock's stamps come back exactly once its
offset is subtracted (and a wrong offset moves them by exactly its error, which `shifted` takes back); the offset's
bound is the hull of the estimates before and after a link; round trips on one clock; every host's rows assembled
into one matrix; bad input named. Fidelity (root: network namespaces as hosts, tests/hostsutil.py): three hosts
under torchrun probe geo-ring's relay-shaped links and the entry writes a links file the search reads.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import trio
import trio.testing

from testbed.core import virtual_time
from testbed.core.errors import LinkBroken
from testbed.studies.probe import remote
from testbed.studies.probe.links import fill_matrix
from testbed.studies.probe.measure import TRIO_CLOCK, ladder, link_row
from testbed.core.records import LinkSpec

DELAY_S = 0.007  # the fake link's one way (each piece waits it out before the far end stamps it)
OFFSET_S = 1234.5  # the far end's clock ahead of this one
EXACT = 1e-9


def delayed(stream: trio.abc.ReceiveStream, delay_s: float, offset_s: float):
    """A Receive whose pieces arrive `delay_s` after they were read, stamped on a clock `offset_s` ahead."""
    async def receive() -> tuple[bytes, float]:
        data = await stream.receive_some()
        await trio.sleep(delay_s)
        return data, trio.current_time() + offset_s
    return receive


def probe_over_memory(test, far_offset_s: float = OFFSET_S, assumed_offset_s: float = OFFSET_S):
    """test(probe) with a PeerProbe over an in-memory connection to a serve_peer, both ways DELAY_S, on virtual
    time; the far end's clock `far_offset_s` ahead, the probe told `assumed_offset_s`."""
    async def main():
        near, far = trio.testing.memory_stream_pair()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(remote.serve_peer, delayed(far, DELAY_S, far_offset_s), far.send_all)
            probe = remote.PeerProbe(near, delayed(near, DELAY_S, 0.0), TRIO_CLOCK, assumed_offset_s)
            out = await test(probe)
            nursery.cancel_scope.cancel()
        return out
    return virtual_time.run_sync(main)


@pytest.mark.exact
def test_one_way_times_from_the_far_clock_come_back_exactly_once_its_offset_is_subtracted():
    rows = probe_over_memory(lambda p: ladder(p, [64, 4096], 5, 10.0, 1.0, lambda m: None))
    assert [r.samples for r in rows] == [5, 5]
    for r in rows:
        assert r.one_way_ms_p50 == pytest.approx(DELAY_S * 1e3, abs=EXACT)
        assert r.one_way_ms_min == pytest.approx(DELAY_S * 1e3, abs=EXACT)
    # an offset 2 ms short moves every one-way time 2 ms long; shifted() takes the correction back exactly
    wrong = probe_over_memory(lambda p: ladder(p, [64], 5, 10.0, 1.0, lambda m: None),
                              assumed_offset_s=OFFSET_S - 0.002)
    assert wrong[0].one_way_ms_p50 == pytest.approx(DELAY_S * 1e3 + 2.0, abs=1e-6)
    fixed = remote.shifted(wrong, -2.0)
    assert fixed[0].one_way_ms_p50 == pytest.approx(DELAY_S * 1e3, abs=1e-6)
    assert fixed[0].mbit_s == pytest.approx(64 * 8 / DELAY_S / 1e6, rel=1e-6)  # NetPIPE's figure from the new p50


@pytest.mark.exact
def test_a_ping_pong_is_the_round_trip_on_one_clock_whatever_the_offset():
    rows = probe_over_memory(lambda p: remote.ping_ladder(p, [64, 1024], 4, 10.0, 1.0, lambda m: None),
                             assumed_offset_s=0.0)
    assert [r.samples for r in rows] == [4, 4]
    for r in rows:
        assert r.rtt_ms_p50 == pytest.approx(2 * DELAY_S * 1e3, abs=EXACT)


@pytest.mark.exact
def test_frames_are_read_from_any_pieces():
    frames = (remote.FRAME.pack(remote.ONE_WAY, 5) + b"hello" + remote.FRAME.pack(remote.STAMPED, 8)
              + remote.STAMP.pack(2.5) + remote.FRAME.pack(remote.PING, 0))
    for cut in range(1, len(frames)):
        reader = remote.FrameReader()
        got = reader.feed(frames[:cut], 1.0) + reader.feed(frames[cut:], 2.0)
        assert [(f.kind, f.size) for f in got] == [(remote.ONE_WAY, 5), (remote.STAMPED, 8), (remote.PING, 0)]
        assert remote.STAMP.unpack(got[1].body) == (2.5,)
        assert got[0].stamp == (1.0 if cut >= remote.FRAME.size + 5 else 2.0)  # its last byte's piece
    with pytest.raises(LinkBroken, match="does not speak"):
        remote.FrameReader().feed(remote.FRAME.pack(9, 1), 0.0)


@pytest.mark.exact
def test_the_offset_is_the_hull_of_its_estimates_before_and_after():
    # before: 10 +- 0.1 ms; after (the clocks drifted): 10.4 +- 0.1 ms -> [9.9, 10.5]: 10.2 +- 0.3
    offset, bound = remote.offset_hull([(0.0100, 0.0001), (0.0104, 0.0001)])
    assert offset == pytest.approx(0.0102, abs=EXACT) and bound == pytest.approx(0.0003, abs=EXACT)
    assert remote.offset_hull([(5.0, 0.2), (5.0, 0.1)]) == pytest.approx((5.0, 0.2), abs=EXACT)


def host_rows(src: int, dst_ms: dict[int, float], names=("a", "b", "c")) -> str:
    sizes = [remote.SizeRow(64, 3, ms, ms, ms, 0.0) for ms in dst_ms.values()]
    return remote.rows_text([link_row(f"{src}->{dst}", names[src], names[dst], LinkSpec(src, dst, ms), [size])
                             for (dst, ms), size in zip(dst_ms.items(), sizes)])


@pytest.mark.exact
def test_every_hosts_rows_make_one_matrix_and_a_missing_host_is_named():
    texts = {0: host_rows(0, {1: 5.0, 2: 9.0}), 1: host_rows(1, {0: 6.0, 2: 3.0}), 2: host_rows(2, {0: 8.0, 1: 4.0})}
    rows = remote.assemble(texts, 3)
    assert [r.link for r in rows] == ["0->1", "0->2", "1->0", "1->2", "2->0", "2->1"]
    names, matrix, fills = fill_matrix(rows)
    assert names == ("a", "b", "c")
    assert matrix == ((0.0, 5.0, 9.0), (6.0, 0.0, 3.0), (8.0, 4.0, 0.0))  # every pair measured: none filled
    assert all(f in ("", "measured") for row in fills for f in row)
    with pytest.raises(LinkBroken, match="no links from host 2"):
        remote.assemble({0: texts[0], 1: texts[1]}, 3)
    with pytest.raises(LinkBroken, match="measured by two hosts"):
        remote.assemble({0: texts[0], 1: texts[0], 2: texts[2]}, 3)


@pytest.mark.exact
def test_the_pairs_a_host_measures():
    from testbed.api import scenario
    from testbed.hosts.probe import configured, pairs

    sc = scenario("geo-ring")
    assert pairs(sc, shaped=True) == [(0, 1), (1, 2), (2, 0)]  # emulated: the scenario's links
    assert len(pairs(sc, shaped=False)) == 6  # the real network: every ordered pair
    assert configured(sc, 1, 0).delay_ms == configured(sc, 0, 1).delay_ms == 130.0  # the reverse link's figure


@pytest.mark.exact
def test_the_host_probe_outside_torchrun_says_how_to_start_it():
    result = subprocess.run([sys.executable, "-m", "testbed.hosts.probe", "geo-ring"], capture_output=True, text=True,
                            env={"PATH": "/usr/bin:/bin"}, timeout=120)
    assert result.returncode == 1, result.stderr
    assert "runs under torchrun" in result.stderr and "Traceback" not in result.stderr


# --- several hosts on one box ------------------------------------------------------------------------------------
@pytest.mark.fidelity
@pytest.mark.skipif(os.geteuid() != 0, reason="namespaces as hosts need root")
def test_three_hosts_probe_the_geo_rings_relay_shaped_links_and_the_entry_writes_the_file(tmp_path):
    from tests.hostsutil import Hosts, assert_nothing_left
    from testbed.studies.search.spec import load_spec

    out = tmp_path / "links.toml"
    hosts = Hosts()
    try:
        logs = [tmp_path / f"host{i}.log" for i in range(hosts.n)]
        args = ["geo-ring", "--shape", "relay", "--set", "network.rate_mbit=100", "--sizes", "64,1Mi",
                "--samples", "5", "--budget-s", "30"]
        procs = [start_probe(hosts, i, *args, *(["--out", str(out)] if i == 0 else []), log=logs[i])
                 for i in range(hosts.n)]
        codes = [proc.wait(timeout=180) for proc in procs]
        text = "\n".join(log.read_text() for log in logs)
        assert codes == [0, 0, 0], text
        assert_nothing_left(hosts)
    finally:
        hosts.close()
    (tmp_path / "s.toml").write_text('model = "llama-3.1-8b"\nregions = "links.toml"\n'
                                     '[[machines]]\nhardware = "a100-80gb"\nregion = "dublin"\n')
    spec = load_spec(str(tmp_path / "s.toml"))
    assert spec.matrix.names == ("hong-kong", "dublin", "new-york")
    for (a, b), ms in {("hong-kong", "dublin"): 130.0, ("dublin", "new-york"): 40.0,
                       ("new-york", "hong-kong"): 110.0}.items():
        assert ms <= spec.matrix.ms(a, b) <= ms + 0.5, (a, b)
    assert spec.rate_mbit == pytest.approx(100.0, rel=0.03)
    body = out.read_text()
    assert "one_way_bound_ms" in body and "round_trip_ms" in body
    assert all("clock offset to host" in log.read_text() for log in logs)  # each host's own, with its bound


def start_probe(hosts, i: int, *args: str, log) -> subprocess.Popen:
    """tests.hostsutil.Hosts.start's torchrun, running the host probe instead of a node."""
    from tests.hostsutil import ROOT, TORCHRUN

    argv = ["ip", "netns", "exec", hosts.names[i], TORCHRUN, f"--nnodes={hosts.n}", "--nproc-per-node=1",
            "--rdzv-backend=c10d", f"--rdzv-endpoint={hosts.address(0)}:{hosts.port}", "--max-restarts=0",
            f"--rdzv-conf=join_timeout=120,is_host={int(i == 0)}", f"--local-addr={hosts.address(i)}",
            "-m", "testbed.hosts.probe", *args, "--stage", str(i), "--iface", "eth0"]
    env = {**os.environ, "TMPDIR": str(log.parent)}
    return subprocess.Popen(argv, cwd=ROOT, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)
