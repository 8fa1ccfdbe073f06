"""Speculation's own [decode] keys (decode.k, decode.k_sweep, ...): SpecSettings, read by speculative and dsd."""

from __future__ import annotations

from dataclasses import dataclass

from testbed.core.settings import ModeSettings, between, integers, setting

K_MAX_BOUND = 64  # the largest draft length any setting may ask for
ALPHA_PRIOR = 0.7  # a draft's acceptance before any is measured (the K chooser's, auto dilation's forecast)
ALPHA_CAP = 0.999  # an acceptance is capped here where K* is sought: K* of alpha = 1 is unbounded


@dataclass(frozen=True)
class SpecSettings(ModeSettings):
    """How many tokens a round drafts, and the rounds a run makes."""

    k: int | str = setting(4, between(1, K_MAX_BOUND, integer=True, words=("auto",)))  # draft length, or "auto"
    k_max: int = setting(24, between(1, K_MAX_BOUND, integer=True))  # the largest K "auto" may choose
    k_sweep: tuple[int, ...] = setting((), integers(1, K_MAX_BOUND))  # a K sweep in one run: rounds_per_k at each K
    rounds_per_k: int = setting(30, between(1, 100_000, integer=True))
    # at least this many rounds, however few tokens they take (0: decode.tokens alone ends the run); the geo ring
    # asks for enough rounds that K = "auto" and the rate settle (testbed/scenario/builtin/geo-ring.toml)
    min_rounds: int = setting(0, between(0, 100_000, integer=True))
