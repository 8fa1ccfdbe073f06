"""The workload's requests at the serving entry: drawn (or replayed), fitted to the model's context, each into the
queue at its arrival time (a mixin of agents.modes.serve.runner.ServeMode).

A fixed prompt or output length that no request can have within the model's context is a ConfigError naming the key
and the limit (the serve mode emulates no longer context). Drawn lengths and a trace's are fitted one by one
(workload.fitted: the output at most half the context, the prompt at most the rest); the run says at its start how
many it fitted, and every record carries the lengths asked for beside the tokens computed.
"""

from __future__ import annotations

import dataclasses

import torch

from agents.modes.serve.requests import RequestSpec
from agents.modes.serve.runner.request import Request
from agents.modes.serve.settings import MAX_TOKENS
from agents.modes.serve.workload import FITTED, check_fits, fitted, generate
from agents.zoo.prompts import synthetic
from testbed.core.errors import ConfigError


class Arrivals:
    """Makes the workload's requests and puts each into the entry's queue when it arrives."""

    def request(self, spec: RequestSpec, prompt: list[int], arrival: float,
                asked: RequestSpec | None = None) -> Request:
        return Request(spec, prompt, arrival, torch.Generator().manual_seed(self.config.seed + spec.index),
                       asked=asked or spec)

    def prompt_of(self, spec: RequestSpec) -> list[int]:
        """Real text of the (fitted) prompt's length from the shipped corpus (agents.zoo.prompts)."""
        return synthetic(spec.prompt_tokens, spec.index, self.stage.model.vocabulary)

    def workload(self) -> list[RequestSpec]:
        """The workload's requests as asked for (a trace's arrival times stretched by trace_scale); a fixed length
        past the model's context is a ConfigError naming its key."""
        settings = self.settings
        try:
            check_fits(settings.workload(), self.block_size, self.ring.spec.model)
        except ValueError as exc:
            key, _, message = str(exc).partition(": ")
            raise ConfigError(message, key=key) from exc
        specs = generate(settings.workload(), max_prompt=MAX_TOKENS, max_output=MAX_TOKENS)
        if settings.arrival == "trace" and settings.trace_scale != 1.0:
            specs = [dataclasses.replace(s, arrival_s=s.arrival_s * settings.trace_scale) for s in specs]
        return specs

    def say_fitted(self, specs: list[RequestSpec]) -> None:
        """The run's notice of the requests the model's context clipped (none: no notice)."""
        clipped = [s for s in specs if fitted(s, self.block_size) != s]
        if clipped:
            self.ring.report_event("notice", {"message": (
                f"{len(clipped)} of {len(specs)} {FITTED} ({self.block_size} positions):"
                f" each computes at most half of it as output and the rest as prompt (longest asked: prompt "
                f"{max(s.prompt_tokens for s in clipped)}, output {max(s.output_tokens for s in clipped)} tokens); "
                f"their records carry requested_prompt_tokens and requested_output_tokens beside the tokens computed")})

    async def arrivals(self, specs: list[RequestSpec]) -> None:
        """Each request into the queue at its arrival time on the ring's clock, fitted to the context."""
        clock = self.ring.clock
        for asked in specs:
            await clock.sleep_until(self.origin + asked.arrival_s)
            spec = fitted(asked, self.block_size)
            self.events_send.send_nowait(("request", self.request(spec, self.prompt_of(spec), clock.now(), asked)))
        self.events_send.send_nowait(("arrived", None))
