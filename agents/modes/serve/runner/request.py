"""A request at the serving entry (agents.modes.serve.runner): its spec, its slot while admitted, its sequence and
tokens, its lap in flight, and (decode.speculate) its draft."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import trio

from agents.modes.serve.requests import RequestRecord, RequestSpec
from agents.modes.speculative.runner import Drafter


@dataclass(eq=False)  # a request is itself: found in the queue by identity
class Request:
    """A request at the entry. `index` is its slot while admitted (the stream id its frames carry: StreamsMode's
    front reads the attributes a Stream has), `spec.index` its own number."""

    spec: RequestSpec
    prompt: list[int]
    arrival: float
    generator: torch.Generator
    index: int = -1  # its slot while admitted
    sequence: list[int] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    token_times: list[float] = field(default_factory=list)
    admitted: float | None = None
    lap: int = -1  # lap number of its frame in flight
    kind: str = "prefill"
    n_tok: int = 0
    start: float = 0.0
    aborted: bool = False
    record: RequestRecord | None = None
    tokens: trio.MemorySendChannel | None = None  # a submitted request's tokens, as they are sampled
    # decode.prefill_chunk: its prompt's chunks before the last, out on the ring: lap -> (sent, tokens, chunk, chunks)
    chunks_out: dict[int, tuple[float, int, int, int]] = field(default_factory=dict)
    # decode.speculate: its draft (own cache and draws keyed by position) and the drafts of its lap in flight
    drafter: Drafter | None = None
    drafts: list[int] = field(default_factory=list)
    qs: list[torch.Tensor] = field(default_factory=list)
    asked: RequestSpec | None = None  # the request as its workload asked for it, where the context clipped `spec`

    @property
    def generated(self) -> int:
        return len(self.ids)

    @property
    def kv_need(self) -> int:
        """The K and V positions it holds at its end, reserved when it is admitted: its prompt and output tokens (the
        [geometry]'s: a synthetic prompt stands for its requested length)."""
        return self.spec.prompt_tokens + self.spec.output_tokens

    def ended(self, at: float) -> RequestRecord:
        """Its record: completed, or aborted with what it got until `at`."""
        return RequestRecord(
            index=self.spec.index, arrival=self.arrival, admitted=self.admitted,
            first_token=self.token_times[0] if self.token_times else None, token_times=tuple(self.token_times),
            finished=at, prompt_tokens=len(self.prompt), output_tokens=len(self.ids), aborted=self.aborted,
            ids=tuple(self.ids), requested_prompt_tokens=(self.asked or self.spec).prompt_tokens,
            requested_output_tokens=(self.asked or self.spec).output_tokens)
