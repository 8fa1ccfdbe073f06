"""Faults measured against the model (issue 15): jitter and loss on every link of a real ring; output intact."""

import subprocess
import sys

import numpy as np
import pytest

from testbed import api
from testbed.studies.faults.measure import jitter_lap_s, loss_lap_s, lost_share, with_fault
from tests.ringutil import EXACT, run


def test_the_jitter_model_is_a_sum_of_clamped_normals():
    mean, p99 = jitter_lap_s(0.010, [0.020, 0.005], 0.005, seed=1)
    rng = np.random.default_rng(2)
    draws = 0.010 + np.maximum(0, 0.020 + 0.005 * rng.standard_normal(400_000)) \
        + np.maximum(0, 0.005 + 0.005 * rng.standard_normal(400_000))
    assert mean == pytest.approx(draws.mean(), rel=1e-3)
    assert p99 == pytest.approx(np.percentile(draws, 99), rel=5e-3)
    assert jitter_lap_s(0.010, [0.020], 0.0) == (0.030, 0.030)


def test_the_loss_model_adds_a_timeout_per_lost_frame():
    mean, p99 = loss_lap_s(0.010, 0.060, 3, 0.05, 0.200)
    assert mean == pytest.approx(0.070 + 3 * 0.05 * 0.200)
    assert p99 == pytest.approx(0.070 + 0.200)  # P(no loss or one loss) = 0.99275 >= 0.99
    assert loss_lap_s(0.0, 0.0, 3, 0.0, 0.2) == (0.0, 0.0)


def test_bad_fault_lists_exit_2():
    result = subprocess.run([sys.executable, "-m", "testbed", "faults", "geo-ring", "--losses", "0,101"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "--losses" in result.stdout


PROBE_AND_PREFILL_CHUNKS = 6  # every link carries 5 probe frames and the prompt's before the first decode lap


def replayed_hops_s(link, laps: int) -> list[float]:
    """Each decode lap's latency on `link` from its own seeded draws, replayed here (the relay's model: one
    chunk per lap, propagation max(0, delay + Normal(0, jitter)), then a loss draw when the link has loss)."""
    import random

    rng, out = random.Random(link.seed), []
    for i in range(PROBE_AND_PREFILL_CHUNKS + laps):
        latency = max(0.0, link.delay_ms / 1e3 + rng.gauss(0.0, link.jitter_ms / 1e3))
        out.append(latency)
    return out[PROBE_AND_PREFILL_CHUNKS:]


def test_jitter_and_loss_cost_what_the_model_says_and_corrupt_nothing():
    """The geo ring at scale 0.1 (hops 13, 4, 11 ms; C 3.3 ms; RTO 20 ms), 150 tokens, on simulated time: jitter
    3 ms on every link, then 5% loss on every link, each against the clean run, exactly."""
    import trio

    from testbed.launch.launcher import run_scenario
    from testbed.launch.runlog import RunLog

    base = with_fault(api.scenario("geo-ring", overrides=["scale=0.1", "decode.tokens=150", "decode.temperature=0"]))
    clean = run(base)
    jittered_sc = with_fault(base, jitter_ms=3.0)
    jittered = run(jittered_sc)
    lossy_sc = with_fault(base, loss_pct=5.0)
    log = RunLog(lossy_sc)
    lossy = trio.run(lambda: run_scenario(lossy_sc, "virtual", runlog=log, log=lambda m: None))
    assert jittered.token_ids == clean.token_ids and lossy.token_ids == clean.token_ids
    assert 1 / clean.measured_tok_s == pytest.approx(clean.compute_s + base.t_ring_s, rel=EXACT)
    # jitter: the lap is C plus each link's own seeded draws, replayed here, to 1e-6 ...
    replayed = sum(np.mean(replayed_hops_s(link, jittered.laps)) for link in jittered_sc.ring)
    assert 1 / jittered.measured_tok_s == pytest.approx(jittered.compute_s + replayed, rel=EXACT)
    # ... and jitter_lap_s is the expectation of that sample mean: within its standard error (3 sigma)
    mean, _ = jitter_lap_s(jittered.compute_s, [link.delay_ms / 1e3 for link in base.ring], 0.003)
    assert abs(1 / jittered.measured_tok_s - mean) < 3 * 0.003 * (3 / jittered.laps) ** 0.5
    # loss: the seeded draws lost some share of the ~450 hop crossings, a binomial outcome of p = 5% (3 sigma) ...
    lost = lost_share(log, base.loss_rto_ms / 1e3)
    n = 3 * lossy.laps
    assert abs(lost - 0.05) * n < 3 * (n * 0.05 * 0.95) ** 0.5
    # ... and each cost exactly one timeout: the lap is the model's with that share
    mean, _ = loss_lap_s(lossy.compute_s, base.t_ring_s, 3, lost, base.loss_rto_ms / 1e3)
    assert 1 / lossy.measured_tok_s == pytest.approx(mean, rel=EXACT)


def test_the_relay_reports_the_delays_it_drew():
    """The relay's realized delays (Shaper.realized_propagation) are its seeded draws, every chunk it carried: the
    decode laps' and the probes', the prompt's and the shutdown's. The faults study's jitter model with them
    (drawn_lap_s) is a sample of this run, not the expectation: much nearer the lap than jitter_lap_s."""
    import random

    import trio

    from testbed.launch.launcher import run_scenario
    from testbed.launch.runlog import RunLog
    from testbed.studies.faults.measure import drawn_lap_s

    base = with_fault(api.scenario("geo-ring", overrides=["scale=0.1", "decode.tokens=150", "decode.temperature=0"]))
    sc = with_fault(base, jitter_ms=3.0)
    log = RunLog(sc)
    summary = trio.run(lambda: run_scenario(sc, "virtual", runlog=log, log=lambda m: None))
    for link in sc.ring:
        mean, chunks = log.propagation[link.name]
        assert chunks == PROBE_AND_PREFILL_CHUNKS + summary.laps + 1  # + the shutdown
        rng = random.Random(link.seed)
        replayed = [max(0.0, link.delay_ms / 1e3 + rng.gauss(0.0, link.jitter_ms / 1e3)) for _ in range(chunks)]
        assert mean == pytest.approx(float(np.mean(replayed)), rel=1e-12)
    lap = 1 / summary.measured_tok_s
    drawn = drawn_lap_s(summary.compute_s, sc.ring, log.propagation, 1.0)
    expected, _ = jitter_lap_s(summary.compute_s, [link.delay_ms / 1e3 for link in base.ring], 0.003)
    assert abs(drawn / lap - 1) < 0.25 * abs(expected / lap - 1)  # here +0.16% against +1.0%
    assert drawn_lap_s(summary.compute_s, sc.ring, {}, 1.0) is None  # a backend that does not report them


def test_the_kernel_tcp_reader_parses_this_namespace():
    """/proc/thread-self/net of the test's own namespace: the counters are there, and established connections
    count as senders (RTO) or receivers (ATO) by whether their local port listens."""
    import socket

    from testbed.studies.faults.measure import read_namespace_tcp

    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        accepted, _ = server.accept()
        with client, accepted:
            values = read_namespace_tcp()
    assert {"TCPTimeouts", "TCPLossProbes", "TCPLossProbeRecovery", "RetransSegs"} <= set(values)
    assert values["rto_n"] >= 1 and values["ato_n"] >= 1 and values["rto_sum"] / values["rto_n"] >= 200


def test_a_netem_table_prices_the_kernels_recovery_next_to_the_relay_model():
    import io

    from rich.console import Console

    from testbed.studies.faults.measure import FaultRow, FaultsResult, KernelTcp, table

    clean = FaultRow("loss", 0.0, 20, 31.0, 33.0, 31.0, 31.0, 0.0, True)
    lossy = FaultRow("loss", 5.0, 20, 50.0, 250.0, 34.0, 51.0, 47.0, True, 3.0, 33.0, 19.0, 3.0, 215.0,
                     KernelTcp(0, 3, 3, 3, 230.0, 40.0))
    console = Console(file=io.StringIO(), width=400)
    console.print(table(FaultsResult("geo-ring", "netem", 3.0, 28.0, 20.0, (clean, lossy), 3)))
    text = " ".join(console.file.getvalue().split())  # the caption wraps at the table's width
    assert "19.0 / 3.0" in text and "215" in text  # measured penalty per lap / the relay's N p RTO; one loss's cost
    assert "0 RTO expiries + 3 tail-loss probes (3 repaired)" in text and "N x 3.00% lost x 215 ms = 19.3 ms/lap" in text
    assert "33.0 │ +51.52" in text  # the model with the realized share, and the lap against it
    assert "at 5% its 60 hop crossings expect 3.0 +- 1.7 timeouts and took 2" in text  # 20 laps x 3 hops, 3% lost
    userspace = Console(file=io.StringIO(), width=200)
    userspace.print(table(FaultsResult("geo-ring", "userspace", 3.0, 28.0, 20.0, (clean,), 3)))
    assert "per loss" not in userspace.file.getvalue()


def test_shapers_are_a_checked_list():
    import argparse

    from testbed.core.errors import ConfigError
    from testbed.studies.faults.measure import shapers_of

    assert shapers_of(argparse.Namespace(shaper="auto", shapers="userspace,netem")) == ["userspace", "netem"]
    assert shapers_of(argparse.Namespace(shaper="netem")) == ["netem"]
    with pytest.raises(ConfigError, match="--shapers"):
        shapers_of(argparse.Namespace(shaper="auto", shapers="userspace,tc"))
