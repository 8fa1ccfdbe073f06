"""The codecs' arithmetic apart from the frame layout (agents.process.wire): blockwise absmax int8 (Petals-style), and the
bytes an emulated geometry's hidden state takes under each codec."""

from __future__ import annotations

import numpy as np

from testbed.core.decode import WireConfig


def quantize_blocks(x: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    """Blockwise absmax int8 of the flattened x: q = round(x / s), s = max|x| / 127 per block of `block` values."""
    flat = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    n_blocks = -(-flat.size // block)
    padded = np.zeros(n_blocks * block, np.float32)
    padded[:flat.size] = flat
    blocks = padded.reshape(n_blocks, block)  # [blocks, block]
    scales = np.abs(blocks).max(axis=1) / 127.0  # [blocks]
    safe = np.where(scales > 0, scales, 1.0)
    q = np.clip(np.rint(blocks / safe[:, None]), -127, 127).astype(np.int8).reshape(-1)[:flat.size]
    return q, scales.astype(np.float32)


def dequantize_blocks(q: np.ndarray, scales: np.ndarray, block: int, shape: tuple[int, ...]) -> np.ndarray:
    n = q.size
    expanded = np.repeat(scales, block)[:n]  # the scale of each value's block
    return (q.astype(np.float32) * expanded).reshape(shape)


def int8_block_bytes(n_values: int, block: int) -> int:
    return n_values + 4 * (-(-n_values // block))


def emulated_payload_bytes(n_positions: int, codec: WireConfig) -> int:
    """Bytes the hidden state of `n_positions` positions of the emulated geometry takes under the codec: f32 (no
    compression) sends the geometry's own dtype, f16 at most 2 bytes a value, int8-block 1 byte and its scales."""
    values = n_positions * codec.width
    if codec.codec == "int8-block":
        return int8_block_bytes(values, codec.block)
    return values * (min(2, codec.value_bytes) if codec.codec == "f16" else codec.value_bytes)
