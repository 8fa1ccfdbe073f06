"""The models an agent process computes with, loaded once per process and shared by whatever runs in it."""

from __future__ import annotations

from agents.model import GPT

_SHARED: dict[str, GPT] = {}


def shared_model(name: str) -> GPT:
    """agents.train.load_model(name), once per process: read-only weights, so the agents of a virtual run (all in
    one process, netem.virtual) share one copy, and a real agent process loads each name once."""
    if name not in _SHARED:
        from agents.train import load_model

        _SHARED[name] = load_model(name)
    return _SHARED[name]
