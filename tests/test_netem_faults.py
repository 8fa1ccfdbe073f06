"""`testbed faults` on the kernel backend (issue 15): netem drops real segments and the kernel's TCP recovers them.

Runs where netem runs (root + sch_netem; in CI inside user-mode-linux, ~45 s). The geo ring at scale 0.1 (hops 13,
4, 11 ms; the relay's RTO 20 ms), 40 tokens, loss 0 and 5% on every link: the output stays the clean run's, and a
lost frame costs what the kernel measures (a tail-loss probe or an RTO, both floored at TCP_RTO_MIN = 200 ms, which
no scale shrinks), far more than the relay's scaled 20 ms, so the relay's model underprices netem's loss here.
"""

import argparse

import pytest
import trio

from testbed.studies.faults.measure import measure

pytestmark = pytest.mark.netem


def test_netem_loss_costs_the_kernels_recovery_not_the_relays_rto():
    args = argparse.Namespace(scenario="geo-ring", overrides=["scale=0.1"], tokens=40, shaper="netem", dilation=1.0,
                              budget_s=40.0)

    async def main():
        with trio.fail_after(240):
            return await measure(args, [0.0], [5.0], lambda m: None)

    result = trio.run(main)
    assert result.shaper == "netem"
    clean, lossy = result.fault_rows
    assert clean.same_output and lossy.same_output  # faults delay data, never corrupt it
    kernel = lossy.kernel
    # ~120 hop crossings at 5%: some were lost (P(none) ~ 0.2%), and the kernel resent each by a probe or an RTO
    assert lossy.lost_pct > 0 and kernel.retrans_segs >= 1 and kernel.loss_probes + kernel.timeouts >= 1
    assert kernel.rto_ms >= 200  # srtt + max(4 rttvar, TCP_RTO_MIN)
    assert lossy.per_loss_ms > 150  # the 200 ms floor prices a lone lost segment (one frame, the next waits the lap)
    # The relay's scaled model prices a loss at its 20 ms RTO; the kernel's recovery of one, measured on the lost hops
    # themselves, costs far more. (The per-lap penalty, a difference of two 40-lap runs' means, is in the table next
    # to the model, but not held here: with one to three losses a run it is within UML's run-to-run noise, and CI
    # measured 14.6 ms against 22.9 expected from the losses, then 1.6 and 2.4 against at least 4.)
    assert lossy.per_loss_ms > 5 * result.rto_ms
