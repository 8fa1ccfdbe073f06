"""The serve mode's two records, the contract between its parts: a workload's request (RequestSpec: when it
arrives, how long its prompt and its output are) and what the entry reports of each one served (RequestRecord).

Every serving figure (TTFT, TPOT, ITL, E2EL, queueing, goodput: agents.modes.serve.slo), the Prometheus families
(vLLM's names) and the endpoint's `usage` read RequestRecord; nothing else records a request. No torch here.

Times: RequestSpec.arrival_s is from the start of the workload (the first request may arrive after 0);
RequestRecord's times are the entry's clock (simulated seconds on the virtual backend), all in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

import trio

from testbed.core.jsonrecord import JsonRecord


@dataclass(frozen=True)
class RequestSpec(JsonRecord):
    """One request of a workload (agents.modes.serve.workload makes them, seeded; a trace replays them)."""

    index: int  # 0, 1, ... in arrival order
    arrival_s: float  # from the workload's start
    prompt_tokens: int  # >= 1
    output_tokens: int  # >= 1: the request ends at this many tokens (EOS ignored, as the benchmarks do)


@dataclass(frozen=True)
class RequestRecord(JsonRecord):
    """One request as the entry served it. A request that never got its first token has first_token = None; one
    aborted (its client went away) has aborted = True and the tokens it got until then."""

    index: int
    arrival: float  # it reached the entry's queue
    admitted: float | None  # it left the queue: its prefill began (queueing time = admitted - arrival)
    first_token: float | None  # its first output token was sampled (TTFT = first_token - arrival)
    token_times: tuple[float, ...]  # when each output token was sampled, the first included (ITL: their gaps)
    finished: float | None  # its last token was sampled, or it was aborted (E2EL = finished - arrival)
    prompt_tokens: int
    output_tokens: int  # tokens generated (= the spec's output_tokens when it completed)
    aborted: bool = False
    ids: tuple[int, ...] = ()  # the generated token ids (greedy: equal to a solo run's)
    # the lengths its workload asked for (None: as computed): a drawn or replayed length past the model's context is
    # fitted to it (prompt_tokens and output_tokens are what the ring computed; agents.modes.serve.workload.fitted)
    requested_prompt_tokens: int | None = None
    requested_output_tokens: int | None = None

    @property
    def completed(self) -> bool:
        return not self.aborted and self.finished is not None


@dataclass
class Submitted:
    """A request handed to the serve mode's runner from outside its workload (the HTTP endpoint): its index, its
    tokens as they are sampled (the channel closes when it completes or is aborted), and how to abort it (its
    client went away: the runner drops it, frees its batch slot and KV within one lap, and records it aborted)."""

    index: int
    tokens: trio.MemoryReceiveChannel  # each generated token id, in order
    abort: Callable[[], None]
    record: Callable[[], RequestRecord | None]  # its record once it ended (usage, timings), None before


class Engine(Protocol):
    """What the endpoint (agents.modes.serve.endpoint) needs of the ring's entry: the serve mode's runner is one."""

    model_name: str  # what GET /v1/models lists and requests must name
    max_context: int  # prompt tokens + max_tokens beyond this: HTTP 400

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...

    async def submit(self, prompt_ids: list[int], max_tokens: int) -> Submitted: ...
