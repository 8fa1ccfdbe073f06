"""The echo mode's runner: the entry feeds the prompt back one byte per lap (teacher forcing)."""

from __future__ import annotations

import dataclasses

from agents.zoo.configs import encode
from agents.process.ring import RingClient
from testbed.core.decode import DecodeConfig
from tests.echo_mode.facts import Echoed


class EchoMode:
    """Each lap carries the next prompt byte and reports it as the lap's token: the wall, on a fixed input."""

    def __init__(self, config: DecodeConfig, ring: RingClient) -> None:
        self.config = config
        self.ring = ring

    async def run(self) -> int:
        ids = encode(self.config.prompt)
        for pos, token in enumerate(ids[: self.config.tokens]):
            _, record = await self.ring.lap([token], pos, "decode", lambda logits: None)
            self.ring.report(dataclasses.replace(record, tokens=1, ids=(token,), facts=Echoed(pos, token)))
        return min(len(ids), self.config.tokens)


Runner = EchoMode
