"""PUBLISHED.md row 10 as a search file (testbed/studies/search/published/prima-row10.toml): prima.cpp's four home
devices (the hardware presets apple-m1, rtx-3070-laptop, rtx-2080-ti, kirin-9000) and Llama 3-8B, the published
split beside the search's, with the published TPOT (54 ms) printed, never fitted to."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed import cli
from testbed.studies.search.measure import searched
from testbed.studies.search.spec import load_spec

pytestmark = pytest.mark.exact

ROW10 = Path(__file__).resolve().parents[1] / "testbed" / "studies" / "search" / "published" / "prima-row10.toml"
MACHINES = ("d1-mac-m1", "d2-laptop", "d3-desktop", "d4-mate40pro")


def test_the_searchs_split_of_the_home_ring_beats_the_even_split_and_says_why(capsys):
    """By the closed forms a layer costs ~14x more on the phone's CPU (D4) than on the 2080 Ti (D3): the even split's
    lap is held by D4's stage, and the search's split of the same ring, in the same order, moves layers onto D3 (as
    many as its 11 GB hold) and is at least as fast; the reason names the stage and the move, and the published
    54 ms (18.52 tok/s) is printed beside the prediction."""
    result, space, _ = searched(load_spec(str(ROW10)))
    case = result.published
    assert case.theirs.split == "even" and case.theirs.layers == (8, 8, 8, 8)
    assert case.theirs.machines == case.ours.machines == MACHINES
    assert case.ours.tok_s >= case.theirs.tok_s
    assert case.gain > 2  # the phone's and the Mac's stages, 8 layers each at their bandwidth, set the even lap
    d1, d2, d3, d4 = case.layer_ms
    assert d3 < d2 < d1 < d4 and d4 / d3 > 10
    assert case.bottleneck == 3 and case.ours.layers[2] == space.capacity(2, False, False)
    assert "stage 3 d4-mate40pro takes the lap longest" in case.reason and "onto d3-desktop" in case.reason
    assert case.figure_tok_s == pytest.approx(1000 / 54, abs=0.01)
    assert cli.main(["search", str(ROW10), "--confirm", "0"]) == 0
    out = capsys.readouterr().out
    assert "PUBLISHED.md row 10" in out and "18.52" in out and "TPOT 54 ms" in out
    assert "takes the lap longest" in out and "1:1:29:1" in out
