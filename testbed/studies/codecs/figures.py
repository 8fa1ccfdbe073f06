"""The codecs study in the report: `testbed codecs --json` rows (a list, each told apart by its
"greedy_agreement") checked and tabled: bytes on the wire, encode and decode time, and what the codec does to
the model."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from testbed.core.decode import CODECS
from testbed.core.errors import ConfigError
from testbed.studies.codecs.result import CodecRow
from testbed.scenario.validate import check_count, check_number, check_text, record_from
from testbed.studies.style import DASH


# CodecRow numbers: (field, minimum, maximum); KL has no minimum, as a distribution equal to f32's can come out a
# rounding error below 0.
CODEC_NUMBERS: Final = (("ratio_to_f32", 0.0, None), ("encode_us", 0.0, None), ("decode_us", 0.0, None),
                        ("greedy_agreement", 0.0, 1.0), ("kl_nats", None, None), ("alpha_hat", 0.0, 1.0))

CODEC_COUNTS: Final = (("block", 1), ("token_frame_bytes", 1), ("prompt_frame_bytes", 1))


@dataclass(frozen=True)
class SourcedCodec:
    """One row of a codec table (`testbed codecs --json`, a list) and where it came from ("file.json[2]")."""

    source: str
    row: CodecRow


def parse_codec(data: dict, source: str) -> SourcedCodec:
    """One `testbed codecs --json` row -> a checked CodecRow; field errors become ConfigError."""
    row = record_from(CodecRow, data, source, "a codec row")
    check_text(row.codec, source, "codec", CODECS)
    for key, minimum in CODEC_COUNTS:
        check_count(getattr(row, key), minimum, source, key)
    check_count(row.bytes_per_hop, 0, source, "bytes_per_hop", required=False)
    for key, minimum, maximum in CODEC_NUMBERS:
        check_number(getattr(row, key), source, key, minimum=minimum, maximum=maximum)
    for key in ("ttft_measured_s", "ttft_predicted_s"):
        check_number(getattr(row, key), source, key, minimum=0.0, required=False)
    if (row.ttft_measured_s is None) != (row.ttft_predicted_s is None):
        raise ConfigError("expected TTFT measured and predicted both or neither", source=source,
                          key="ttft_predicted_s" if row.ttft_predicted_s is None else "ttft_measured_s")
    return SourcedCodec(source, row)


def _codec_label(row: CodecRow) -> str:
    return f"{row.codec} (block {row.block})" if row.codec == "int8-block" else row.codec


def codec_markdown(items: Sequence[SourcedCodec]) -> list[str]:
    lines = ["| source | codec | 1-token frame (B) | prompt frame (B) | vs f32 | encode (µs) | decode (µs) "
             "| greedy agreement | KL (nats) | α̂ | TTFT measured / predicted (ms) |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for item in items:
        row = item.row
        ttft = DASH if row.ttft_measured_s is None else (f"{row.ttft_measured_s * 1e3:.1f} / "
                                                         f"{row.ttft_predicted_s * 1e3:.1f}")
        lines.append(f"| {item.source} | {_codec_label(row)} | {row.token_frame_bytes} | {row.prompt_frame_bytes} | "
                     f"{row.ratio_to_f32:.3f} | {row.encode_us:.0f} | {row.decode_us:.0f} | "
                     f"{row.greedy_agreement:.4f} | {row.kl_nats:.2e} | {row.alpha_hat:.4f} | {ttft} |")
    return lines
