"""python -m testbed codecs: what each wire codec costs on the wire and does to the model (seed 001, "Laps and Bytes").

Petals ships blockwise 8-bit activations ("halves bandwidth"). For f32, f16 and int8-block this prints,
side by side:

- bytes of a one-token frame and of a PROMPT_TOKENS-token prompt frame (header included), and the ratio to f32;
- encode and decode time of those frames (the wire layer's own functions, best of several repetitions);
- the effect on the model, teacher-forced over a fixed text (windows of the shipped source that synthetic
  prompts come from), with the hidden state passed through the codec at every cut of the scenario's ring
  (every hop, the return included): greedy agreement with f32, mean KL(p_f32 || p_codec) of the next-token
  distributions, and the acceptance rate alpha-hat = mean sum_x min(q_draft, p) of the trained draft against
  the codec'd target (the rate speculation would see), at temperature 1;
- with --measure, a real run per codec: TTFT of a PROMPT_TOKENS prompt on the ring at SLOW_RATE_MBIT, measured
  vs C_prefill + T_ring + serialization of the bytes that codec put on each hop.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
import trio
from rich.console import Console
from rich.table import Table

from agents.process import wire
from agents.zoo.prompts import synthetic
from testbed.studies.base import (dilation_cell, dilation_of, ensure_models_on, make_scenario, plan_runs, print_tables,
                                  write_json)
from testbed.scenario.config import Scenario
from testbed.core.decode import WireConfig
from testbed.core.errors import ConfigError
from testbed.studies.codecs.result import CodecRow

COMPARED = (WireConfig("f32"), WireConfig("f16"), WireConfig("int8-block", 64), WireConfig("int8-block", 16))
PROMPT_TOKENS = 128
WINDOWS = 16  # teacher-forced windows of the fixed text
WINDOW_TOKENS = 128
TIMING_REPEATS = 200
SLOW_RATE_MBIT = 10.0


def label(codec: WireConfig) -> str:
    return f"{codec.codec}/{codec.block}" if codec.codec == "int8-block" else codec.codec


def through(hidden: torch.Tensor, codec: WireConfig) -> torch.Tensor:
    """A hidden state [1, T, C] as the next stage receives it: encoded, framed, decoded, float32."""
    frame = wire.decode(wire.encode(wire.Frame(wire.Kind.HIDDEN, tensor=hidden.numpy()), codec))
    return torch.from_numpy(frame.tensor.astype(np.float32))


@torch.inference_mode()
def ring_logits(model, ids: list[int], cuts: list[tuple[int, int]], codec: WireConfig) -> torch.Tensor:
    """Logits [T, V] of the model split at `cuts`, with every hop (the return to the head too) through the codec."""
    x = model.embed(torch.tensor([ids]), 0)
    for first, last in cuts:
        x = through(model.run_layers(x, first, last), codec)
    return model.head(x)[0]


def frame_timing_us(tensor: np.ndarray, codec: WireConfig) -> tuple[int, float, float]:
    frame = wire.Frame(wire.Kind.HIDDEN, tensor=tensor)
    data = wire.encode(frame, codec)
    encode = decode = float("inf")
    for _ in range(TIMING_REPEATS):
        t0 = time.perf_counter()
        wire.encode(frame, codec)
        t1 = time.perf_counter()
        wire.decode(data)
        t2 = time.perf_counter()
        encode, decode = min(encode, t1 - t0), min(decode, t2 - t1)
    return len(data), encode * 1e6, decode * 1e6


@torch.inference_mode()
def quality(scenario: Scenario, codecs: tuple[WireConfig, ...]) -> dict[str, tuple[float, float, float]]:
    """(greedy agreement, mean KL, alpha-hat) of each codec over the fixed windows."""
    from agents.zoo.train import MODEL_CONFIGS, load_model

    model, draft = load_model(scenario.model), load_model("draft")
    cuts = scenario.layer_ranges(MODEL_CONFIGS[scenario.model].n_layer)
    windows = [synthetic(WINDOW_TOKENS, 7 * w) for w in range(WINDOWS)]
    reference = [torch.log_softmax(ring_logits(model, ids, cuts, WireConfig("f32")), -1) for ids in windows]
    drafts = [torch.softmax(draft(torch.tensor([ids]))[0], -1) for ids in windows]
    out = {}
    for codec in codecs:
        agree, kl, alpha, n = 0.0, 0.0, 0.0, 0
        for ids, ref, q in zip(windows, reference, drafts):
            logp = torch.log_softmax(ring_logits(model, ids, cuts, codec), -1)
            agree += float((logp.argmax(-1) == ref.argmax(-1)).sum())
            kl += float((ref.exp() * (ref - logp)).sum())
            alpha += float(torch.minimum(q, logp.exp()).sum())
            n += len(ids)
        out[label(codec)] = (agree / n, kl / n, alpha / n)
    return out


def measure_ttft(scenario_name: str, codec: WireConfig, args: argparse.Namespace) -> dict:
    from testbed.launch.launcher import run_scenario

    overrides = list(args.overrides) + [f'wire.codec="{codec.codec}"', f"wire.block={codec.block}",
                                        "decode.mode=plain", f"decode.prompt_tokens={PROMPT_TOKENS}",
                                        "decode.tokens=2", f"network.rate_mbit={SLOW_RATE_MBIT}"]
    scenario = make_scenario(scenario_name, overrides=overrides)
    summary = trio.run(lambda: run_scenario(scenario, args.shaper, log=lambda m: None, dilation=args.dilation))
    t = summary.ttft
    return {"ttft_measured_s": t.measured_s, "ttft_predicted_s": t.predicted_s, "bytes_per_hop": t.bytes_per_hop,
            **dilation_of(summary)}


def rows(scenario_name: str, args: argparse.Namespace, console: Console) -> list[CodecRow]:
    scenario = make_scenario(scenario_name, overrides=list(args.overrides))
    from agents.zoo.train import MODEL_CONFIGS

    if scenario.model not in MODEL_CONFIGS:  # a checkpoint, or a null model: no byte model's hidden states to code
        raise ConfigError(f"the codecs' quality is measured on a byte model's hidden states, not {scenario.model!r}",
                          source=scenario.source, key="model")
    width = MODEL_CONFIGS[scenario.model].n_embd
    rng = np.random.default_rng(0)
    token = rng.standard_normal((1, 1, width)).astype(np.float32)
    prompt = rng.standard_normal((1, PROMPT_TOKENS, width)).astype(np.float32)
    console.print(f"teacher-forcing {WINDOWS} windows of {WINDOW_TOKENS} tokens through {scenario.n_stages} cuts...")
    figures = quality(scenario, COMPARED)
    f32_bytes = None
    out = []
    plan_runs(len(COMPARED) if args.measure else 0)
    for codec in COMPARED:
        token_bytes = len(wire.encode(wire.Frame(wire.Kind.HIDDEN, tensor=token), codec))
        prompt_bytes, encode_us, decode_us = frame_timing_us(prompt, codec)
        f32_bytes = f32_bytes or prompt_bytes
        agree, kl, alpha = figures[label(codec)]
        ttft = {}
        if args.measure:
            console.print(f"measuring TTFT of a {PROMPT_TOKENS}-token prompt at {SLOW_RATE_MBIT:g} Mbit/s, {label(codec)}...")
            ttft = measure_ttft(scenario_name, codec, args)
        out.append(CodecRow(codec.codec, codec.block, token_bytes, prompt_bytes, prompt_bytes / f32_bytes, encode_us,
                            decode_us, agree, kl, alpha, **ttft))
    return out


def table(rows_: list[CodecRow], scenario: str) -> Table:
    out = Table(title=f"Wire codecs on {scenario}: bytes, time, and what the model sees (teacher-forced, every hop)")
    for col in ("codec", "1-token frame B", f"{PROMPT_TOKENS}-token frame B", "vs f32", "encode us", "decode us",
                "greedy agree", "KL nats", "alpha-hat", f"TTFT @{SLOW_RATE_MBIT:g} Mbit/s meas / pred", "D"):
        out.add_column(col, justify="right")
    for r in rows_:
        ttft = (f"{r.ttft_measured_s * 1e3:.1f} / {r.ttft_predicted_s * 1e3:.1f} ms"
                if r.ttft_measured_s is not None else "-")
        out.add_row(f"{r.codec}" + (f" (block {r.block})" if r.codec == "int8-block" else ""), str(r.token_frame_bytes),
                    str(r.prompt_frame_bytes), f"{r.ratio_to_f32:.3f}", f"{r.encode_us:.0f}", f"{r.decode_us:.0f}",
                    f"{r.greedy_agreement:.4f}", f"{r.kl_nats:.2e}", f"{r.alpha_hat:.4f}", ttft,
                    dilation_cell(r.dilation, r.capped_error_pct, duration=True) if r.dilation is not None else "-")
    return out


def run(args: argparse.Namespace, console: Console) -> list[CodecRow]:
    ensure_models_on(console)
    return rows(args.scenario, args, console)


def show(result: list[CodecRow], args: argparse.Namespace, console: Console) -> None:
    print_tables(console, [table(result, args.scenario)])
    if args.json:
        write_json(args.json, "[\n" + ",\n".join(r.to_json() for r in result) + "\n]", console)
