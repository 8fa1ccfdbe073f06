"""Plain autoregressive decode: one token per lap, at the wall r = 1 / (C + T_ring)."""

from __future__ import annotations

import dataclasses

import torch

from agents.zoo.prompts import prompt_ids
from agents.process.ring import CONTEXT_KEEP, RingClient
from testbed.core.decode import DecodeConfig
from testbed.core.records import LapRecord


class PlainMode:
    def __init__(self, config: DecodeConfig, ring: RingClient) -> None:
        self.config = config
        self.ring = ring
        self.generator = torch.Generator().manual_seed(config.seed)

    @classmethod
    def last_head(cls, config: DecodeConfig, ring: RingClient):
        """placement.head = "last": the last stage samples each lap's token (agents.process.head.sampled_head)."""
        from agents.process.head import sampled_head

        return sampled_head(cls(config, ring).sample)

    def sample(self, logits: torch.Tensor) -> int:
        last = logits[-1]
        if self.config.temperature <= 0:
            return int(torch.argmax(last))
        probs = torch.softmax(last / self.config.temperature, dim=-1)
        return int(torch.multinomial(probs, 1, generator=self.generator))

    # How a token's forward pass travels: one lap around the ring (a subclass may traverse otherwise: agents.modes.tp).
    async def traverse(self, block: list[int], pos: int, kind: str) -> tuple[int, LapRecord]:
        return await self.ring.lap(block, pos, kind, self.sample)

    async def prefill(self, prompt: list[int]) -> tuple[int, LapRecord]:
        return await self.ring.prefill(prompt, self.config.prefill_chunk, self.sample)

    def report(self, record: LapRecord) -> None:
        self.ring.report(record)

    async def step(self, block: list[int], pos: int, kind: str) -> int:
        token, record = await self.traverse(block, pos, kind)
        self.report(dataclasses.replace(record, tokens=1, ids=(token,)))
        return token

    async def run(self) -> int:
        """Decode config.tokens tokens; returns how many were generated."""
        block_size = self.ring.stage.model.config.block_size
        sequence = prompt_ids(self.config, self.ring.stage.model)
        token, record = await self.prefill(sequence)
        self.report(dataclasses.replace(record, tokens=1, ids=(token,)))
        sequence.append(token)
        generated = 1
        while generated < self.config.tokens:
            if len(sequence) >= block_size:
                # Context full: start a new sequence from the recent tokens (a prefill lap, not a decode lap).
                sequence = sequence[-CONTEXT_KEEP:]
                sequence.append(await self.step(sequence, 0, "prefill"))
            else:
                sequence.append(await self.step([sequence[-1]], len(sequence) - 1, "decode"))
            generated += 1
        return generated


Runner = PlainMode  # what an agent of this mode runs (ModeInfo.runner_path)
