"""The codecs study's result: one row per wire codec (a `testbed codecs --json` file is a list of them)."""

from __future__ import annotations

from dataclasses import dataclass

from testbed.core.records import JsonRecord


@dataclass(frozen=True)
class CodecRow(JsonRecord):
    codec: str
    block: int
    token_frame_bytes: int
    prompt_frame_bytes: int
    ratio_to_f32: float
    encode_us: float  # the prompt frame
    decode_us: float
    greedy_agreement: float  # share of positions whose argmax equals f32's
    kl_nats: float  # mean KL(p_f32 || p_codec)
    alpha_hat: float  # draft vs the codec'd target
    ttft_measured_s: float | None = None
    ttft_predicted_s: float | None = None
    bytes_per_hop: int | None = None
    dilation: float | None = None  # the TTFT run's D (with --measure)
    capped_error_pct: float | None = None  # where the budget capped D: the error its overhead leaves (base.dilation_of)
