"""The entry as a server: requests arrive, wait in a queue, and are admitted into the ring's continuous batch.

The streams mode's machinery (its entry step: the head of every returned frame in one pass, the front of the next
tokens as one BATCH frame) with requests coming and going. The policy, which agents.modes.serve.queueing models:

- A request arrives (the workload's, at its arrival time on the ring's clock; or one `submit` hands in) and waits in
  a FIFO queue. It is admitted while fewer than the cap (decode.streams, and workload.max_concurrency where it is
  lower) are admitted and not ended: it takes a free slot (a stream id: a KV cache at every stage), and its prompt
  leaves the entry at once as a frame of its own (a prefill at position 0, which resets the slot's cache at every
  stage before it is used again). Its first token is sampled when that frame comes back.
- The convoy: every running request with a token to go leaves the entry together, one BATCH frame (a HIDDEN frame
  when it is one request), and comes back together. A request whose first token came joins the convoy at its next
  departure; with no convoy out it departs at once as the convoy.
- A request ends at its output length (EOS ignored, as the benchmarks do), or is dropped at its next return to the
  entry once aborted: its slot (and so its KV) is free for the next request the queue admits.

The entry is one server: a step (heads, the convoy's front, the prefills it admits) is padded to its emulated cost;
arrivals during it wait for its end (their queueing counts from arrival). The records of the requests that ended in a
step ride on the first lap it reports (ServeLap, with the running and waiting counts): the laps' path to the launcher.
The workload's requests and their fit to the model's context (runner/arrivals.py), chunked prefill
(decode.prefill_chunk: runner/prefill.py), speculation (decode.speculate: runner/speculating.py) and the KV budget
(Scenario.kv_positions) are documented in docs/modes/serve.md. Not yet: a context longer than the model's (emulated),
shipped KV, heads off the entry.
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import math

import numpy as np
import torch
import trio

from agents.modes.serve.facts import ServeLap
from agents.modes.serve.requests import RequestRecord, RequestSpec, Submitted
from agents.modes.serve.runner.arrivals import Arrivals
from agents.modes.serve.runner.prefill import ChunkedPrefill
from agents.modes.serve.runner.request import Request
from agents.modes.serve.runner.speculating import Speculating
from agents.modes.serve.settings import EndpointSettings, ServeSettings, ServeSpecSettings
from agents.modes.speculative.runner import Drafter, PositionRandom
from agents.modes.streams.runner import StreamsMode, lap_rows, unique_frames
from agents.process import wire
from agents.process.ring import RingClient
from testbed.core.decode import DecodeConfig
from testbed.core.errors import ConfigError, PeerTimeout, WireError
from testbed.core.facts import PrefillChunk
from testbed.core.records import LapRecord


HTTP_GRACE_S = 5.0  # the endpoint's last responses, written after the ring is empty (hypercorn's graceful_timeout: 3 s)


class ServeMode(Arrivals, Speculating, ChunkedPrefill, StreamsMode):
    """The serve mode's entry: run() serves the workload of [workload] (and whatever `submit` hands in while
    `keep_open`) and returns the tokens generated. It is an Engine (agents.modes.serve.requests) for the endpoint."""

    def __init__(self, config: DecodeConfig, ring: RingClient) -> None:  # noqa: D107 - StreamsMode's streams not made
        self.config = config
        self.ring = ring
        self.stage = ring.stage
        self.block_size = ring.stage.model.config.block_size
        self.continuous = True  # the convoy is one BATCH frame (ServeSettings.fixed_decode)
        self.lap_no = 0
        self.settings = config.settings(ServeSettings)
        self.cap = min(config.streams, self.settings.max_concurrency or config.streams)
        self.free_slots = list(range(self.cap))  # a heap: the lowest free slot first (deterministic)
        # the KV budget (Scenario.kv_positions; 0: none): an admitted request holds its whole KV until it ends, so
        # one is admitted only while the others' and its own fit (no preemption, unlike vLLM's paged blocks)
        self.kv_budget, self.kv_held = ring.spec.kv_positions, 0
        self.spec_k = config.settings(ServeSpecSettings).speculate
        if self.spec_k:
            from agents.process.shared import draft_name, shared_model

            self.draft_model = shared_model(draft_name(config.draft, ring.stage.model))
        self.waiting: collections.deque[Request] = collections.deque()
        self.slots: dict[int, Request] = {}  # admitted and not ended, by slot
        self.joining: list[Request] = []  # first token sampled, waiting for the convoy's next departure
        self.convoy_out = False
        self.prefills_out = 0
        self.ended: list[RequestRecord] = []  # ended since the last report
        self.generated = 0
        self.origin = 0.0  # the workload's start on the ring's clock
        self.next_index = 0
        self.keep_open = False  # the endpoint sets it: run() serves submissions until close()
        self.arrivals_done = False
        self.events_send, self.events = trio.open_memory_channel[tuple[str, object]](math.inf)
        # (an event is never refused: an arrival's time is its own, not the entry's; frames are bounded by the cap)

    # --- the Engine protocol (agents.modes.serve.endpoint) ---------------------------------------------------

    @property
    def model_name(self) -> str:
        return self.ring.spec.model

    @property
    def max_context(self) -> int:
        return self.block_size

    def encode(self, text: str) -> list[int]:
        return list(self.stage.model.vocabulary.encode(text))

    def decode(self, ids: list[int]) -> str:
        return self.stage.model.vocabulary.decode(list(ids))

    async def submit(self, prompt_ids: list[int], max_tokens: int) -> Submitted:
        """A request from outside the workload: it arrives now; its tokens come on the returned channel."""
        if not prompt_ids or max_tokens < 1 or len(prompt_ids) + max_tokens > self.block_size:
            raise ValueError(f"a request needs 1 <= prompt tokens, 1 <= max_tokens and their sum <= "
                             f"{self.block_size}, got {len(prompt_ids)} and {max_tokens}")
        if self.kv_budget and len(prompt_ids) + max_tokens > self.kv_budget:
            raise ValueError(f"a request's prompt and max_tokens ({len(prompt_ids) + max_tokens} positions) exceed the "
                             f"KV cache the ring's memory holds ({self.kv_budget} positions)")
        index, self.next_index = self.next_index, self.next_index + 1
        now = self.ring.clock.now()
        spec = RequestSpec(index, now - self.origin, len(prompt_ids), max_tokens)
        request = self.request(spec, list(prompt_ids), now)
        send, receive = trio.open_memory_channel[int](math.inf)  # the entry never waits for a slow client
        request.tokens = send
        self.events_send.send_nowait(("request", request))
        return Submitted(index, receive, lambda: self.abort(request), lambda: request.record)

    def close(self) -> None:
        self.keep_open = False
        self.events_send.send_nowait(("wake", None))

    # --- requests ------------------------------------------------------------------------------------------------

    def abort(self, request: Request) -> None:
        """Its client went away: a waiting request ends now; an admitted one at its next return to the entry."""
        if request.record is not None or request.aborted:
            return
        request.aborted = True
        if request in self.waiting:
            self.waiting.remove(request)
            self.end(request, self.ring.clock.now())
        elif request in self.joining:
            self.joining.remove(request)
            self.end(request, self.ring.clock.now())

    def end(self, request: Request, at: float) -> None:
        request.record = request.ended(at)
        self.ended.append(request.record)
        if request.index >= 0:
            del self.slots[request.index]
            heapq.heappush(self.free_slots, request.index)
            request.index = -1
            self.kv_held -= request.kv_need
        if request.tokens is not None:
            request.tokens.close()

    # --- the entry's loop ------------------------------------------------------------------------------------

    async def frames(self) -> None:
        """Every burst that comes back, whole, as one event (a burst is completed here, so a wait for the next event
        can be cancelled without losing half a burst)."""
        ring = self.ring
        while True:
            items = [await ring.inbox.receive()]  # no deadline here: the loop's wait holds it while frames are out
            while True:
                while (item := ring.receive_now()) is not None:
                    items.append(item)
                if not wire.burst_left(items[-1][0]):
                    break
                items.append(await ring.receive())
            await self.events_send.send(("frames", items))

    def busy(self) -> bool:
        return bool(self.waiting or self.slots)

    async def next_event(self) -> tuple[str, object]:
        """The next event; while frames are out, within the ring's lap timeout."""
        if not (self.convoy_out or self.prefills_out):
            return await self.events.receive()
        with trio.move_on_after(self.ring.lap_timeout_s):
            return await self.events.receive()
        raise PeerTimeout(f"stage 0: no frame back within {self.ring.lap_timeout_s:g} s (box time) with "
                          f"{len(self.slots)} requests in the ring")

    async def run(self) -> int:
        """Serve the workload (and submissions while keep_open: the endpoint's); returns the tokens generated."""
        if self.ring.n_stages == 1:
            raise WireError("the serve mode needs a ring of at least two stages")
        specs = self.workload() if self.settings.requests or self.settings.duration_s or \
            self.settings.arrival == "trace" else []
        endpoint = self.config.settings(EndpointSettings)
        if not specs and not endpoint.port:
            raise ConfigError("the serve mode has no requests to serve: set workload.requests or workload.duration_s, "
                              "or open the HTTP endpoint (--http PORT)", key="workload.requests")
        self.next_index = len(specs)
        self.say_fitted(specs)
        self.origin = self.ring.clock.now()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.frames)
            nursery.start_soon(self.arrivals, specs)
            if endpoint.port:
                await self.open_endpoint(nursery, endpoint)
            while not (self.arrivals_done and not self.keep_open and not self.busy()):
                kind, payload = await self.next_event()
                if kind == "request":
                    self.waiting.append(payload)
                    await self.admit()
                elif kind == "frames":
                    await self.step(payload)
                elif kind == "arrived":
                    self.arrivals_done = True
            if endpoint.port:  # the last responses written whole (their last tokens, usage, [DONE]) before it closes
                self.http_shutdown.set()
                with trio.move_on_after(HTTP_GRACE_S):
                    await self.http_stopped.wait()
            nursery.cancel_scope.cancel()
        return self.generated

    async def open_endpoint(self, nursery: trio.Nursery, endpoint: EndpointSettings) -> None:
        """The OpenAI-compatible endpoint in this nursery (agents.modes.serve.endpoint): submissions are taken until
        endpoint.serve_s has passed (box time), or until the run is stopped."""
        from agents.modes.serve.endpoint import serve_http

        self.keep_open = True
        self.http_shutdown, self.http_stopped = trio.Event(), trio.Event()

        async def serve(task_status=trio.TASK_STATUS_IGNORED) -> None:
            try:
                await serve_http(self, host=endpoint.host, port=endpoint.port, api_key=endpoint.api_key or None,
                                 shutdown=self.http_shutdown, task_status=task_status)
            finally:
                self.http_stopped.set()
        host, port = await nursery.start(serve)
        self.ring.report_event("notice", {"message": f"OpenAI-compatible endpoint: http://{host}:{port}/v1 (model "
                                                     f"{self.model_name!r}{', API key required' if endpoint.api_key else ''})"})
        if endpoint.serve_s:
            nursery.start_soon(self.close_after, endpoint.serve_s)

    async def close_after(self, seconds: float) -> None:
        await trio.sleep(seconds)
        self.close()  # no more submissions: run() returns once every request in the ring has ended

    async def admit(self) -> None:
        """Admit from the queue's head while there is a free slot: each prompt leaves at once as its own frame."""
        while self.waiting and self.free_slots:
            need = self.waiting[0].kv_need
            if self.kv_budget and need > self.kv_budget:  # it can never fit: refused as it comes to the head
                refused = self.waiting.popleft()
                refused.aborted = True
                self.end(refused, self.ring.clock.now())
                continue
            if self.kv_budget and self.kv_held + need > self.kv_budget:
                return  # the head of the queue waits for KV to free (first come, first served)
            request = self.waiting.popleft()
            self.kv_held += need
            request.index = heapq.heappop(self.free_slots)
            self.slots[request.index] = request
            request.sequence = list(request.prompt)
            if self.spec_k:  # a draft cache of its own, its draws keyed by (request, position): common random numbers
                request.drafter = Drafter(self.draft_model, self.config.draft, self.config.alpha,
                                          self.config.temperature, self.config.draft_ms / 1e3,
                                          PositionRandom(self.config.seed * 7919 + request.spec.index), self.ring.clock,
                                          self.ring.dilation)
            start = self.ring.clock.now()
            request.admitted = start
            chunk = self.config.prefill_chunk
            if 0 < chunk < len(request.prompt) and self.ring.n_stages > 1:
                await self.prefill_chunks(request, chunk)
            else:
                await self.front([request], prefill=True, step_start=start)
            self.prefills_out += 1

    def returned(self, items: list[tuple[wire.Frame, float]]) -> list[tuple[Request, wire.Frame, float]]:
        """The requests whose frames came back (a BATCH frame's rows each), each checked to be a lap in flight."""
        arrivals = []
        for frame, recv in items:
            for slot, lap in lap_rows(frame, "a request's lap"):
                request = self.slots.get(slot)
                if request is not None and lap in request.chunks_out:  # a prompt's chunk before its last
                    start, n_tok, j, n = request.chunks_out.pop(lap)
                    self.ring.report(LapRecord(lap, "prefill", self.ring.mode, n_tok, 0, start, recv,
                                               tuple(frame.stamps), recv, facts=PrefillChunk(j, n), stream=slot))
                    continue
                if request is None or lap != request.lap:
                    raise WireError(f"expected a request's lap back, got {frame.kind.name} slot {slot} lap {lap}")
                arrivals.append((request, frame, recv))
        return arrivals

    async def step(self, items: list[tuple[wire.Frame, float]]) -> None:
        """Frames came back: sample each request's token, end those done or aborted, send the convoy on (when it
        came back, or when none is out), admit from the queue, report the laps."""
        clock = self.ring.clock
        step_start = clock.now()
        arrivals = self.returned(items)
        if not arrivals:  # only chunks before a prompt's last came back
            return
        stamps: dict[int, tuple] = {}
        for _, frame, _ in arrivals:  # unpacked once a frame
            if id(frame) not in stamps:
                stamps[id(frame)] = tuple(frame.stamps)
        reports: dict[int, list[LapRecord]] = {}
        going, convoy_back = [], False
        chosen = iter(self.next_tokens(arrivals))
        for request, frame, recv in arrivals:
            if request.kind == "prefill":
                self.prefills_out -= 1
            else:
                convoy_back = True
            ids = tuple(next(chosen)[:request.spec.output_tokens - request.generated])
            for token in ids:
                request.sequence.append(token)
                request.ids.append(token)
                request.token_times.append(step_start)
                self.generated += 1
                if request.tokens is not None:
                    request.tokens.send_nowait(token)
            reports.setdefault(id(frame), []).append(
                LapRecord(request.lap, request.kind, self.ring.mode, request.n_tok, len(ids), request.start,
                          step_start, stamps[id(frame)], recv, None, ids, stream=request.index))
            if request.aborted or request.generated >= request.spec.output_tokens:
                self.end(request, step_start)
            else:
                going.append(request)
        if convoy_back:
            self.convoy_out = False
        if self.convoy_out:  # only prompts came back: they wait for the convoy
            self.joining += going
        else:
            departing = [r for r in self.joining + going if not r.aborted]
            for request in self.joining:
                if request.aborted:
                    self.end(request, step_start)
            self.joining = []
            if departing:
                if self.spec_k:
                    await self.front_speculating(departing, step_start)
                else:
                    await self.front(departing, prefill=False, step_start=step_start)
                self.convoy_out = True
        await self.admit()
        first = True
        for records in reports.values():
            if first:
                self.ring.report(dataclasses.replace(records[0], facts=self.lap_facts()))
                records, first = records[1:], False
            if records:
                self.ring.report_laps(records)

    @torch.inference_mode()
    def head_logits(self, arrivals: list[tuple[Request, wire.Frame, float]]) -> torch.Tensor:
        """Last-position logits of every returned request, in one batched pass: [requests, V] (StreamsMode.heads'
        rows as one tensor)."""
        last = np.concatenate([frame.tensor[:, -1, :] for frame, _ in unique_frames(arrivals)])  # [b, C]
        return self.stage.model.head(torch.from_numpy(last)[:, None, :])[:, 0, :]

    def sample_rows(self, logits: torch.Tensor, requests: list[Request]) -> list[int]:
        """Each request's next token from its row of `logits`, as StreamsMode.sample draws it (bit for bit) but in a
        few batched calls: greedy is the rows' argmax; a temperature draws torch.multinomial's one sample, argmax(p / q)
        with q ~ Exp(1) from the request's own generator (one exponential_ call a request, the rest batched).
        tests/test_serve_scale.py holds it to StreamsMode.sample."""
        if not requests:
            return []
        if self.config.temperature <= 0:
            return torch.argmax(logits, dim=-1).tolist()
        probs = torch.softmax(logits / self.config.temperature, dim=-1)
        noise = torch.empty_like(probs)
        for row, request in zip(noise, requests):
            row.exponential_(generator=request.generator)
        return torch.argmax(probs / noise, dim=-1).tolist()

    def lap_facts(self) -> ServeLap:
        ended, self.ended = tuple(self.ended), []
        return ServeLap(ended, running=len(self.slots), waiting=len(self.waiting))


Runner = ServeMode  # what an agent of this mode runs (ModeInfo.runner_path)
