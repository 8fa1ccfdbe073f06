"""bench section 2b: each path of one hop really carries the frames, and what comes back is one-way time."""

import numpy as np
import pytest

from agents.process import wire
from testbed.studies.bench import hop

pytestmark = pytest.mark.fidelity


def test_the_measured_frame_is_the_decode_frame_stamped_when_sent():
    frame = wire.decode(hop.one_token_frame(12.5))
    assert frame.kind == wire.Kind.HIDDEN and frame.tensor.shape == (1, 1, 128)
    assert frame.stamps[-1].send == 12.5


@pytest.mark.parametrize("kind,via_relay", [("raw", False), ("agent", True)])
def test_every_frame_arrives_after_it_was_sent_and_before_the_next(kind, via_relay):
    """One-way times (less the relay's delay) are positive and under the spacing: frames neither lost nor
    matched to the wrong stamp (a frame matched to the next one's stamp would read negative)."""
    samples = hop.one_path(kind, via_relay, 12)
    assert len(samples) == 12
    assert np.all(samples > 0) and np.all(samples < hop.HOP_GAP_S)
