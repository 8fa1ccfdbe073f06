"""The ring client: an agent's links to its peers, the frames it stamps, and one lap around the ring."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np
import torch
import trio

from agents.process import wire
from agents.process.admit import Admission
from agents.process.batching import as_float32, batches, rows_of
from agents.process.reader import FrameReader
from agents.process.spec import AgentSpec
from agents.process.stage import PipelineStage
from agents.process.vectored import write_pieces
from testbed.core import clock as clock_module
from testbed.core.clock import Clock
from testbed.core.errors import LinkBroken, PeerTimeout, WireError
from testbed.core.records import Address, HeadTiming, LapRecord, Stamp
from testbed.core.transport import TCP, Transport

CONNECT_TIMEOUT_S = 30.0
CONNECT_RETRY_S = 0.05
PROBE_LAPS = 5
WARM_LAP = 2**32 - 1  # the lap number of the warm-up frame (RingClient.warm), which no probe uses
FIRST_WINDOW_BYTES = 65_535  # the kernel caps a connection's first advertised receive window at U16_MAX
SHUTDOWN_GRACE_S = 5.0
INBOX_FRAMES = 16  # plus one per stream in flight
CONTEXT_KEEP = 64  # tokens a mode keeps when the context window fills and a new sequence starts


def fits_first_window(payload_bytes: int, n_stages: int) -> bool:
    """Whether a frame of `payload_bytes` (its header, shape and a stamp per stage added) leaves in a fresh TCP
    connection's first window, so that no round trip waits for the window to open. A 128-token prompt of the
    128-wide model is 65,536 bytes of payload, over the window before its header: on netem it measured TTFT +14%
    without the warm-up (codecs --measure at 10 Mbit/s)."""
    return payload_bytes + wire.HEADER.size + n_stages * wire.STAMP.size <= FIRST_WINDOW_BYTES


class RingClient:
    """What a decode mode drives: `await ring.lap(ids, pos, kind, decide)`; middle stages `serve()`.

    `peers` maps every stage this one has a directed link to onto the address that reaches it (the shaper's
    relay or the peer's own address in its namespace); the ring uses the link to the next stage, modes that
    talk to more than the next stage use the others.
    """

    def __init__(self, stage: PipelineStage, spec: AgentSpec, *, report: Callable[[str, dict[str, Any]], None],
                 clock: Clock = clock_module.MONOTONIC, log: Callable[[str], None] = print,
                 transport: Transport = TCP) -> None:
        """`spec` is what the launcher told this agent (its stage, costs, decode settings); the rest is how it talks:
        `report` sends an event to the launcher, `transport` opens and reads links (TCP, or memory on simulated time)."""
        self.stage = stage
        self.spec = spec
        self.index = spec.stage
        self.n_stages = spec.n_stages
        self.compute_s = spec.compute_ms / 1e3  # already dilated by the launcher, as the two below
        self.per_token_s = spec.per_token_ms / 1e3
        self.prefill_per_token_s = spec.prefill_ms_per_token / 1e3
        self.roofline = spec.roofline  # compute from hardware: replaces the three above (StageConfig.cost_ms)
        self.batching = spec.decode.batching
        self.codec = spec.wire  # how hidden states go on the wire; they arrive as float32
        self.kv_ship = spec.kv_ship
        self.tp = spec.tp  # parallel = "tp": the all-reduce agents.modes.tp runs over these links
        # Under time dilation D the real forward passes are padded to D times their length too, so that in the
        # scenario's time (the box's / D) they take what they took (testbed.launch.dilation).
        self.dilation = spec.dilation
        self.mode = spec.decode.mode
        self.report_event = report
        self.clock = clock
        self.transport = transport
        self.log = log
        frames = INBOX_FRAMES + spec.decode.streams
        self.inbox_send, self.inbox = trio.open_memory_channel[tuple[wire.Frame, float]](frames)
        # edge clients' frames (wire.SIDE_KINDS) wait here, apart from the ring's (agents.modes.dsd)
        self.side_send, self.side = trio.open_memory_channel[tuple[wire.Frame, float]](INBOX_FRAMES * 4)
        self.peers: dict[int, trio.abc.Stream] = {}
        self.lap_no = 0
        self.lap_timeout_s = spec.lap_timeout_s
        self.tree_ahead: dict[int, bytes] = {}  # stream -> a TREE frame to send on ahead of its next HIDDEN frame
        # placement.head = "last": (stage, frame, hidden) -> the int32 ids this last stage returns (agents.process.head)
        self.last_head: Callable[[PipelineStage, wire.Frame, np.ndarray], np.ndarray] | None = None
        self.admission = Admission(stage, spec.stage)  # in serve(), a frame that does not fit is refused on arrival

    def cost_s(self, n_tok: int = 1, batch: int = 1, pos: float | None = None) -> float:
        """Emulated compute of a pass over n_tok positions of `batch` streams from position `pos` (their mean; None:
        not known, no context) (StageConfig.cost_ms); a prompt at 0 with the emulated positions it stands for too."""
        extra = self.codec.extra_positions if pos is not None else 0
        n_tok, context = n_tok + (extra if pos == 0 else 0), (pos or 0) + n_tok + extra
        if self.roofline is not None:
            return self.roofline.seconds(n_tok, batch, context)
        return self.compute_s + self.prefill_per_token_s * (n_tok - 1) + self.per_token_s * (batch - 1)

    @property
    def next_stage(self) -> int:
        return (self.index + 1) % self.n_stages

    # --- links ---------------------------------------------------------------------------------

    async def serve_connection(self, stream: trio.abc.Stream) -> None:
        """Read frames from one upstream connection into the inbox; a bad frame closes this connection only."""
        inbound = self.transport.inbound(stream)
        reader = FrameReader(stream, inbound.receive, now=self.clock.now, codec=self.codec)
        try:
            while (item := await reader.read()) is not None:
                if item[0].kind != wire.Kind.KV:
                    inbound.observe(item[1])
                await self.enqueue(item)
                # the rest of a burst that arrived in the same read goes in before anyone looks at the inbox
                while (more := reader.read_buffered()) is not None:
                    await self.enqueue(more)
                item = more = None  # not kept while the next one comes (a batch of prompts is MBs)
        except WireError as exc:
            self.log(f"closing connection: malformed frame: {exc}")
        except LinkBroken as exc:
            self.log(f"upstream connection broke: {exc}")
        finally:
            inbound.close()
            await trio.aclose_forcefully(stream)

    async def enqueue(self, item: tuple[wire.Frame, float]) -> None:
        if item[0].kind == wire.Kind.KV:
            return  # shipped KV: its bytes crossed the link (the cost measured); nothing keeps it
        frame, _ = item = as_float32(item)
        if frame.kind in wire.SIDE_KINDS and self.index != 0:  # only the entry hears edge clients (agents.modes.dsd)
            raise WireError(f"a {frame.kind.name} frame at stage {self.index}: edge clients talk to the entry")
        self.admission.admit(frame)
        channel = self.side_send if frame.kind in wire.SIDE_KINDS else self.inbox_send
        try:
            channel.send_nowait(item)  # a frame of a burst goes in without a scheduling round per frame
        except trio.WouldBlock:
            await channel.send(item)

    async def dial(self, peers: dict[int, Address]) -> None:
        """Open a connection over every outgoing link (the shaper decided what address reaches each peer)."""
        for dst, address in sorted(peers.items()):
            deadline = trio.current_time() + CONNECT_TIMEOUT_S
            while dst not in self.peers:
                try:
                    self.peers[dst] = await self.transport.connect(address)
                except OSError as exc:
                    if trio.current_time() > deadline:
                        raise PeerTimeout(f"cannot reach stage {dst} at {address}: {exc}") from exc
                    await trio.sleep(CONNECT_RETRY_S)

    def kv_frame(self, pos: int, n_tok: int, stream: int = 0) -> list[tuple[bytes, int]]:
        """placement.kv = "ship": this stage's K and V for positions pos..pos+n_tok, encoded ([2, L, T, C] float32),
        and the zeros that follow it (an emulated geometry's K and V on this stage's share of its layers, said in
        the frame's flags); [] when KV stays local."""
        if not self.kv_ship:
            return []
        cache = self.stage.cache_for(stream)
        k = cache.k[:, 0, :, pos:pos + n_tok, :]  # [L, nh, T, hd]
        v = cache.v[:, 0, :, pos:pos + n_tok, :]
        kv = torch.stack([k, v]).permute(0, 1, 3, 2, 4).reshape(2, k.shape[0], n_tok, -1)  # [2, L, T, C]
        layers = self.codec.stage_layers[self.index] if self.codec.kv_layer_bytes else 0
        frame = wire.Frame(wire.Kind.KV, stream=stream, pos=pos, flags=layers, tensor=kv.contiguous().numpy())
        return [wire.encode_parts(frame, dataclasses.replace(self.codec, codec="f32"))]  # KV is never compressed

    async def send(self, frame: wire.Frame, dst: int | None = None, kv: list[tuple[bytes, int]] = ()) -> int:
        """Send a frame after `kv` (frames to go ahead of it on the same link, each as its bytes and the zeros that
        follow them: shipped KV, a tree plan; they delay it as they would). One write where nothing is padded; the
        frame's own stamp takes its send time here, after the encoding, just before the write."""
        pieces, pad = wire.encode_pieces(frame, self.codec)
        pieces[1] = wire.restamped(pieces[1], self.clock.now())
        sent, pending = 0, []
        for part, zeros in (*kv, (pieces, pad)):
            pending += part if isinstance(part, list) else [part]
            if zeros:
                sent, pending = sent + await self.write(pending, dst, zeros), []
        return sent + (await self.write(pending, dst) if pending else 0)

    async def write(self, data: bytes | list[bytes | memoryview], dst: int | None, pad: int = 0) -> int:
        """Send `data` (bytes, or pieces written without joining them), then `pad` zeros (an emulated geometry's
        padding, a piece at a time from wire.zeros)."""
        dst = self.next_stage if dst is None else dst
        if (stream := self.peers.get(dst)) is None:
            raise LinkBroken(f"stage {self.index} has no link to stage {dst}")
        pieces = data if isinstance(data, list) else [data]
        try:
            await write_pieces(stream, pieces, [wire.zeros(min(wire.PAD_PIECE, pad - offset))
                                                for offset in range(0, pad, wire.PAD_PIECE)])
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise LinkBroken(f"stage {dst} closed the connection: {exc}") from exc
        return sum(map(len, pieces)) + pad

    async def receive(self) -> tuple[wire.Frame, float]:
        if (item := self.receive_now()) is not None:  # one already queued needs no timeout (a cancel scope a frame)
            return item
        try:
            with trio.fail_after(self.lap_timeout_s):
                return await self.inbox.receive()
        except trio.TooSlowError as exc:
            raise PeerTimeout(f"stage {self.index}: no frame from upstream within {self.lap_timeout_s:g} s "
                              f"(box time)") from exc

    async def send_burst(self, frames: list[wire.Frame], dst: int | None = None) -> list[int]:
        """Several frames in one write, each flagged with how many follow (a continuous batch moving on together)."""
        left = len(frames) - 1
        encoded = [wire.encode(f, self.codec, flags=(f.flags & ~wire.BURST_MASK) | (left - i))
                   for i, f in enumerate(frames)]
        await self.write(b"".join(encoded), dst)
        return [len(data) for data in encoded]

    def receive_now(self) -> tuple[wire.Frame, float] | None:
        """A frame already in the inbox, or None (no waiting)."""
        try:
            return self.inbox.receive_nowait()
        except trio.WouldBlock:
            return None

    async def receive_burst(self, idle: bool = False) -> list[tuple[wire.Frame, float]]:
        """Every frame queued now, and the rest of any burst among them that is still in flight (continuous batching).
        `idle`: the first may be long in coming (a middle stage between requests: the entry times the laps)."""
        items = [await self.inbox.receive() if idle else await self.receive()]
        while True:
            while (item := self.receive_now()) is not None:
                items.append(item)
            if not wire.burst_left(items[-1][0]):
                return items
            items.append(await self.receive())

    def stamped(self, frame: wire.Frame, recv: float, start: float, real_end: float, end: float,
                tensor: np.ndarray | None, batch: int = 1, extra_bytes: int = 0) -> wire.Frame:
        """The frame to send on, with this stage's stamp (send time taken now, just before sending); the stamp
        counts every byte sent for it on the hop (`extra_bytes`: shipped KV ahead of it)."""
        tensor = frame.tensor if tensor is None else tensor
        size = (wire.HEADER.size + (len(frame.stamps) + 1) * wire.STAMP.size
                + wire.payload_bytes(tensor, self.codec, frame.kind, frame.pos) + extra_bytes)
        stamp = Stamp(self.index, recv, start, real_end, end, self.clock.now(), size, batch)
        return frame.passed_on(tensor, stamp)

    def pass_through(self, frame: wire.Frame, recv: float) -> wire.Frame:
        return self.stamped(frame, recv, recv, recv, recv, None)

    # --- middle stages -------------------------------------------------------------------------

    async def serve(self) -> None:
        """Non-entry stages: compute on every frame and pass it on, until SHUTDOWN.

        batching "none": one frame per forward pass, in arrival order (a frame that arrives while the stage is busy
        queues). "continuous": every one-token frame queued when the stage turns to its inbox (and the rest of their
        bursts) runs as one batched forward pass, then moves on as one burst."""
        self.admission.serving = True
        while True:
            items = await self.receive_burst(idle=True) if self.batching == "continuous" else [await self.inbox.receive()]
            for group in batches(items):
                frame, recv = group[0]
                if frame.kind == wire.Kind.TREE:  # the next block of this stream is a token tree
                    self.stage.set_tree(frame.tensor, frame.pos, frame.stream)
                    if self.next_stage != 0:
                        self.tree_ahead[frame.stream] = wire.encode(dataclasses.replace(frame, stamps=()))
                    continue
                if frame.kind in (wire.Kind.SHUTDOWN, wire.Kind.PROBE):
                    await self.send(self.pass_through(frame, recv))
                    if frame.kind == wire.Kind.SHUTDOWN:
                        return
                    continue
                if len(group) == 1 and frame.kind != wire.Kind.BATCH:
                    await self.serve_one(frame, recv)
                    continue
                await self.serve_batch(group)
            items = group = frame = None  # nothing of them kept while the stage waits (a batch of prompts is MBs)

    async def serve_one(self, frame: wire.Frame, recv: float) -> None:
        """One frame's block in a forward pass of its own, then on (with KV or a tree plan ahead of it)."""
        start = self.clock.now()
        hidden = self.stage.run(frame.tensor, frame.pos, frame.stream)
        if self.last_head is not None:  # only token ids go back
            hidden = self.last_head(self.stage, frame, hidden)
            frame = dataclasses.replace(frame, kind=wire.Kind.TOKEN)
        real_end = self.clock.now()
        n_tok = frame.tensor.shape[1] if frame.tensor is not None and frame.tensor.ndim == 3 else 1
        ahead = self.tree_ahead.pop(frame.stream, b"")
        kv = ([(ahead, 0)] if ahead else []) + self.kv_frame(frame.pos, n_tok, frame.stream)
        await self.clock.sleep_until(start + max(self.cost_s(n_tok, 1, frame.pos), self.dilation * (real_end - start)))
        await self.send(self.stamped(frame, recv, start, real_end, self.clock.now(), hidden,
                                     extra_bytes=wire.parts_len(kv)), kv=kv)

    async def serve_batch(self, group: list[tuple[wire.Frame, float]]) -> None:
        """Continuous batching: the new positions of every stream of the group's frames (one-token HIDDEN frames and
        BATCH frames, or one BATCH frame of prompts) in one forward pass, then each frame on with its rows, as one
        burst."""
        start = self.clock.now()
        x, positions, streams = rows_of(group)
        hidden = self.stage.run_batch(x, positions, streams)
        real_end = self.clock.now()
        b = len(positions)
        cost = self.cost_s(x.shape[1], b, sum(positions) / b)  # each stream reads its KV: b x the mean
        await self.clock.sleep_until(start + max(cost, self.dilation * (real_end - start)))
        end, frames, row = self.clock.now(), [], 0
        for frame, recv in group:
            n = frame.tensor.shape[0]
            frames.append(self.stamped(frame, recv, start, real_end, end, hidden[row:row + n], b))
            row += n
        await self.send_burst(frames)

    # --- entry stage ---------------------------------------------------------------------------

    async def warm(self, nbytes: int) -> None:
        """Open every ring hop's TCP windows to a frame of `nbytes` before the first lap: one PROBE frame that size
        goes around, unrecorded. A warm long-haul connection sends a frame in its delay plus its bytes at the rate;
        a fresh one on the kernel's TCP (netem) would add the round trips its windows take to grow to it."""
        if self.n_stages == 1 or fits_first_window(nbytes, self.n_stages):
            return
        rows = -(-min(nbytes, wire.MAX_PAYLOAD_BYTES) // (4 << 20))  # 4 MiB a row: no dimension over wire.MAX_DIM
        tensor = np.zeros((rows, 1 << 20), np.float32)
        await self.send(self.pass_through(wire.Frame(wire.Kind.PROBE, lap=WARM_LAP, tensor=tensor), self.clock.now()))
        frame, _ = await self.receive()
        if frame.kind != wire.Kind.PROBE or frame.lap != WARM_LAP:
            raise WireError(f"expected the warm-up frame back, got {frame.kind.name} lap {frame.lap}")

    async def probe(self, laps: int = PROBE_LAPS) -> None:
        """Self-check: send empty frames around the ring and report every hop's one-way latency."""
        if self.n_stages == 1:
            return
        for i in range(laps):
            t = self.clock.now()
            await self.send(self.pass_through(wire.Frame(wire.Kind.PROBE, lap=i), t))
            frame, recv = await self.receive()
            self.report_event("probe", {"record": LapRecord(i, "probe", self.mode, 0, 0, t, recv, frame.stamps,
                                                            recv).to_dict()})

    async def lap(self, ids: list[int], pos: int, kind: str, decide: Callable[[torch.Tensor], Any],
                  tree: np.ndarray | None = None, positions: list[int] | None = None, stream: int = 0
                  ) -> tuple[Any, LapRecord]:
        """One traversal for a block of tokens at positions pos..; `decide(logits)` runs in the head.

        Returns decide's result and the lap's record (tokens and ids are the mode's to fill in before `report`). Entry
        compute (front + head) is padded to its cost. A token tree (agents.modes.tree) gives its plan
        (PipelineStage.set_tree) and its nodes' positions; the plan travels ahead of the block."""
        from agents.process.lap import end_lap, lap_record, start_lap

        pending = await start_lap(self, ids, pos, kind, tree, positions, stream)
        back, return_recv = (await self.receive()) if self.n_stages > 1 else (None, 0.0)
        result, ready_at = end_lap(self, pending, back, return_recv, decide)
        await self.clock.sleep_until(ready_at)
        return result, lap_record(self, pending, self.clock.now())

    async def prefill(self, ids: list[int], chunk: int, decide: Callable[[torch.Tensor], Any]) -> tuple[Any, LapRecord]:
        """Chunked prefill (as vLLM and Sarathi), pipelined over the ring: agents.process.prefill."""
        from agents.process.prefill import chunked_prefill

        return await chunked_prefill(self, ids, chunk, decide)

    def head(self, back: wire.Frame, decide: Callable[[torch.Tensor], Any]) -> Any:
        """The lap's result: `decide(logits)` on the returned hidden state, or the token a separate head sampled."""
        if back.kind == wire.Kind.TOKEN and hasattr(decide, "from_ids"):  # a mode that takes several ids (a tree)
            return decide.from_ids(back.tensor.tolist() if back.tensor is not None else [])
        if back.kind == wire.Kind.TOKEN:
            if back.tensor is None or back.tensor.shape != (1,):
                raise WireError(f"expected one sampled token from the head, got {back.tensor!r}")
            return int(back.tensor[0])
        return decide(self.stage.logits(back.tensor))

    def report(self, record: LapRecord) -> None:
        """Send a finished lap's record to the launcher."""
        self.report_event("lap", {"record": record.to_dict()})

    def report_laps(self, records: list[LapRecord]) -> None:
        """Send the laps of one BATCH frame's streams: alike but for their lap, stream and ids, so they go as the
        first one's record and those three per lap (the stamps once, not once per stream: testbed.launch.launcher)."""
        if len(records) == 1:
            return self.report(records[0])
        self.report_event("laps", {"record": records[0].to_dict(), "laps": [r.lap for r in records],
                                   "streams": [r.stream for r in records], "ids": [list(r.ids) for r in records]})

    async def shutdown(self) -> None:
        if self.n_stages == 1 or self.next_stage not in self.peers:
            return
        t = self.clock.now()
        await self.send(self.pass_through(wire.Frame(wire.Kind.SHUTDOWN), t))
        with trio.move_on_after(SHUTDOWN_GRACE_S):
            while True:
                frame, _ = await self.inbox.receive()
                if frame.kind == wire.Kind.SHUTDOWN:
                    break
