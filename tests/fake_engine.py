"""A fake of the serve mode's Engine (agents.modes.serve.requests) on Trio: a byte vocabulary and a ring that
"samples" a fixed repeating text, one byte a token at a set pace, for the HTTP endpoint's tests (no model)."""

from __future__ import annotations

import math
from typing import Final

import trio

from agents.modes.serve.requests import RequestRecord, Submitted

FAKE_MODEL: Final = "geo-ring-fake"
FAKE_TEXT: Final = "The ring turns: héllo, wörld ✓ "  # two- and three-byte characters: tokens split them
FAKE_TOKENS: Final = tuple(FAKE_TEXT.encode())
TOKEN_DELAY_S: Final = 0.002
MAX_CONTEXT: Final = 256


class FakeEngine:
    """The Engine protocol over byte tokens: every request's k-th token is FAKE_TOKENS[k % len], one every
    token_delay_s. Its requests run in the nursery run() opens; each ends with a RequestRecord in `records`.
    hold_after = k: every request stops after k tokens until `release` is set (a request surely in flight)."""

    model_name = FAKE_MODEL

    def __init__(self, *, token_delay_s: float = TOKEN_DELAY_S, max_context: int = MAX_CONTEXT,
                 hold_after: int | None = None):
        self.token_delay_s = token_delay_s
        self.hold_after = hold_after
        self.release = trio.Event()
        self.max_context = max_context
        self.records: dict[int, RequestRecord] = {}
        self.submitted = 0
        self.running: set[int] = set()
        self._nursery: trio.Nursery | None = None

    @staticmethod
    def encode(text: str) -> list[int]:
        return list(text.encode())

    @staticmethod
    def decode(ids: list[int]) -> str:
        return bytes(ids).decode("utf-8", errors="replace")

    @staticmethod
    def text(tokens: int) -> str:
        """What a request of this many output tokens decodes to."""
        return FakeEngine.decode([FAKE_TOKENS[k % len(FAKE_TOKENS)] for k in range(tokens)])

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Hold the requests' nursery until cancelled (the runner's lifetime)."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    async def submit(self, prompt_ids: list[int], max_tokens: int) -> Submitted:
        assert self._nursery is not None, "FakeEngine.run is not running"
        index, self.submitted = self.submitted, self.submitted + 1
        send, receive = trio.open_memory_channel(math.inf)  # the ring never waits for the HTTP client
        scope = trio.CancelScope()
        self.running.add(index)
        self._nursery.start_soon(self._generate, index, len(prompt_ids), max_tokens, send, scope)
        return Submitted(index, receive, scope.cancel, lambda: self.records.get(index))

    async def _generate(self, index: int, prompt_tokens: int, max_tokens: int, send: trio.MemorySendChannel,
                        scope: trio.CancelScope) -> None:
        arrival, ids, times = trio.current_time(), [], []
        try:
            with scope:
                for k in range(max_tokens):
                    if k == self.hold_after:
                        await self.release.wait()
                    await trio.sleep(self.token_delay_s)
                    ids.append(FAKE_TOKENS[k % len(FAKE_TOKENS)])
                    times.append(trio.current_time())
                    send.send_nowait(ids[-1])
        finally:
            self.running.discard(index)
            self.records[index] = RequestRecord(
                index=index, arrival=arrival, admitted=arrival, first_token=times[0] if times else None,
                token_times=tuple(times), finished=trio.current_time(), prompt_tokens=prompt_tokens,
                output_tokens=len(ids), aborted=scope.cancelled_caught or len(ids) < max_tokens, ids=tuple(ids))
            send.close()  # after the record: the endpoint reads `usage` from it once the tokens end
