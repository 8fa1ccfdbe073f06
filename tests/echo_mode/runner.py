"""The echo mode's runner: the entry feeds the prompt back one byte per lap (teacher forcing), every echo_stride-th."""

from __future__ import annotations

import dataclasses

from agents.zoo.configs import encode
from agents.process.ring import RingClient
from testbed.core.decode import DecodeConfig
from tests.echo_mode.facts import Echoed
from tests.echo_mode.settings import EchoSettings


class EchoMode:
    """Each lap carries the next prompt byte and reports it as the lap's token: the wall, on a fixed input."""

    def __init__(self, config: DecodeConfig, ring: RingClient) -> None:
        self.config = config
        self.ring = ring

    async def run(self) -> int:
        ids = encode(self.config.prompt)
        echoed = list(enumerate(ids))[:: self.config.settings(EchoSettings).echo_stride][: self.config.tokens]
        for lap, (pos, token) in enumerate(echoed):  # the lap's own position in the stages' caches: one a lap
            _, record = await self.ring.lap([token], lap, "decode", lambda logits: None)
            self.ring.report(dataclasses.replace(record, tokens=1, ids=(token,), facts=Echoed(pos, token)))
        return len(echoed)


Runner = EchoMode
