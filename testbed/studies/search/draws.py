"""A speculating candidate's confirmation is a draw: the rate a short run measures, beside the search's steady rate.

The search scores synchronous speculation at its steady rate, Gamma(alpha, K) tokens a round. A confirmation decodes
a few tens of tokens: its last round's surplus is dropped, and its rounds are a handful of draws of the acceptance.
"""

from __future__ import annotations

import math

import numpy as np

from agents.modes.serve.queueing import lap_law
from testbed.studies.search.space import Candidate
from testbed.studies.search.spec import SearchSpec


def finite_run(spec: SearchSpec, c: Candidate, tok_s: float) -> dict:
    """Synchronous speculation decoding spec.tokens tokens: the rounds it takes follow lap_law (i.i.d. acceptance at
    the stated alpha, the last round's surplus dropped), so its expected rate is the search's times tokens / (E[rounds]
    Gamma), and the draws spread it by sd(rounds) / E[rounds]: a short confirmation is a draw, not the steady rate."""
    if c.mode != "sync" or spec.tokens < 1:
        return {}
    law = np.array(lap_law(spec.tokens, spec.alpha, c.k))
    rounds = np.arange(len(law))
    mean = float(law @ rounds)
    sd = math.sqrt(max(float(law @ rounds ** 2) - mean ** 2, 0.0))
    gamma = (1 - spec.alpha ** (c.k + 1)) / (1 - spec.alpha)
    return {"finite_tok_s": tok_s * spec.tokens / (mean * gamma), "draw_sd_pct": sd / mean * 100}


def draws_text(c, tokens: int) -> str:
    """The log's clause for a Confirmation (measure.py) that has a finite-run figure."""
    if c.draw_z is None:
        return ""
    return (f"; for a run of {tokens} tokens the search's rate is {c.finite_tok_s:.3f} and the acceptance draws spread "
            f"it by {c.draw_sd_pct:.1f}%: {c.draw_z:+.1f} sd")
