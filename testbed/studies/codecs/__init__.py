"""The codecs study: what each wire codec (f32, f16, int8-block) costs on the wire and does to the model; with
--measure, TTFT on the ring per codec. Its measurement imports torch, so it is imported when the study runs."""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console

from testbed.studies.base import BenchLine, BenchRow, ReportPart, Study
from testbed.studies.codecs import figures


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--measure", action="store_true", help="also run the ring once per codec (TTFT at 10 Mbit/s)")
    parser.add_argument("--json", help="write the rows here")


def run(args: argparse.Namespace, console: Console) -> Any:
    from testbed.studies.codecs import measure

    return measure.run(args, console)


def show(result: Any, args: argparse.Namespace, console: Console) -> None:
    from testbed.studies.codecs import measure

    measure.show(result, args, console)


NOTE = ("Frames with their header; vs f32 = prompt frame bytes over f32's. Greedy agreement, KL(p_f32 || p_codec) "
        "and α̂ (the draft against the codec'd target) are teacher-forced with the codec at every hop; TTFT "
        "(`codecs --measure`) measured vs C_prefill + T_ring + serialization.")

def bench_line(rows: Any) -> BenchLine:
    r = rows[0]
    return BenchLine(f"TTFT, {r.codec}", "s", r.ttft_measured_s, r.ttft_predicted_s, r.dilation, r.capped_error_pct)


STUDY = Study("codecs", "wire codecs (f32, f16, int8-block): bytes, encode/decode time, greedy agreement, KL and "
                        "acceptance rate; --measure: TTFT on the ring per codec", add_options, run, show,
              report=ReportPart("greedy_agreement", "Wire codecs", "codec rows", figures.parse_codec,
                                lambda items: [NOTE, "", *figures.codec_markdown(items)]),
              bench=BenchRow(("geo-ring", "--measure"), bench_line))
