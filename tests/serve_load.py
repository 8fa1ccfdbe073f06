"""256 concurrent streaming clients against the endpoint on the relay (issue 54's "under load the server loses
nothing"), and what the HTTP layer adds: each client's TTFT and ITL from its stream's chunk arrival times, beside the
testbed's own record of the same request (the response id "cmpl-<index>" is RequestRecord.index).

A script, not a test (its figures are real time on a shared box): it starts `testbed run geo-ring --http` on the
userspace shaper itself, sends every request at once, waits for the run's JSON summary and prints one table.

    .venv/bin/python -m tests.serve_load                       # 256 clients x 32 tokens, decode.streams 256
    .venv/bin/python -m tests.serve_load --streams 16          # the --http default cap: the rest queue
    .venv/bin/python -m tests.serve_load --save /tmp/load.jsonl  # every request's client and testbed times

The entry's clock is time.monotonic() on this box (testbed.core.clock.MONOTONIC), the clients' too, so besides the
differences of durations (client TTFT - testbed TTFT) the script reads the one-way legs directly: the request's way in
(record.arrival - the client's send) and each token's way out (its chunk's arrival - record.token_times[k]).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import openai
import trio

from tests.test_prometheus_server import free_port
from tests.test_serve_http import API_KEY, MODEL, Cli, cli_argv

END_TIMEOUT_S = 600
PROMPT = "request {i}: the ring carries every token around the world, "


@dataclass
class Client:
    """One streaming client's view: when it sent, when each chunk with text arrived (monotonic seconds)."""

    index: int
    id: str = ""
    sent: float = 0.0
    chunk_times: list[float] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    error: str | None = None


async def one(api: openai.AsyncOpenAI, client: Client, tokens: int) -> None:
    client.sent = time.monotonic()
    try:
        response = await api.completions.create(model=MODEL, prompt=PROMPT.format(i=client.index),
                                                max_tokens=tokens, stream=True)
        async with response:
            async for chunk in response:
                now = time.monotonic()
                client.id = chunk.id
                for choice in chunk.choices:
                    if choice.text:
                        client.chunk_times.append(now)
                        client.text += choice.text
                    client.finish_reason = choice.finish_reason or client.finish_reason
    except openai.OpenAIError as exc:
        client.error = f"{type(exc).__name__}: {exc}"


async def drive(url: str, clients: list[Client], tokens: int) -> float:
    started = time.monotonic()
    async with openai.AsyncOpenAI(base_url=url, api_key=API_KEY, max_retries=0, timeout=END_TIMEOUT_S) as api:
        async with trio.open_nursery() as nursery:
            for client in clients:
                nursery.start_soon(one, api, client, tokens)
    return time.monotonic() - started


def percentiles(values: list[float]) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return f"{statistics.median(ordered) * 1e3:9.2f} {statistics.fmean(ordered) * 1e3:9.2f} {p99 * 1e3:9.2f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=32, help="max_tokens of each request")
    parser.add_argument("--streams", type=int, default=0, help="decode.streams, the ring's cap (0: --clients)")
    parser.add_argument("--serve-s", type=float, default=20.0, help="endpoint.serve_s: every request is sent at once, "
                                                                    "well within it")
    parser.add_argument("--save", type=Path, help="write every request's client and testbed times as JSON lines")
    args = parser.parse_args(argv)
    summary_path = Path(tempfile.mkdtemp(prefix="serve-load-")) / "summary.json"
    cli = Cli(cli_argv(free_port(), "--api-key", API_KEY, "--set", f"endpoint.serve_s={args.serve_s}",
                       "--set", f"decode.streams={args.streams or args.clients}", "--json", str(summary_path))).start()
    clients = [Client(i) for i in range(args.clients)]
    try:
        url = cli.wait_listening()
        wall = trio.run(drive, url, clients, args.tokens)
        exit_code = cli.wait(END_TIMEOUT_S)
    finally:
        cli.stop()
    if exit_code != 0:
        print(cli.output[-3000:], file=sys.stderr)
        return 1
    summary = json.loads(summary_path.read_text())
    records = {r["index"]: r for r in summary["serve"]["records"]}
    errors = [c for c in clients if c.error or c.finish_reason != "length"]
    matched = [(c, records[int(c.id.removeprefix("cmpl-"))]) for c in clients if c.id.startswith("cmpl-")]
    # where every token completed a character, the k-th text chunk is the k-th token's
    whole = [(c, r) for c, r in matched if len(c.chunk_times) == r["output_tokens"] and not r["aborted"]]
    rows = {
        "TTFT, client (send -> first chunk)": [c.chunk_times[0] - c.sent for c, _ in whole],
        "TTFT, testbed (arrival -> first token)": [r["first_token"] - r["arrival"] for _, r in whole],
        "TTFT added by HTTP (client - testbed)": [(c.chunk_times[0] - c.sent) - (r["first_token"] - r["arrival"])
                                                  for c, r in whole],
        "  way in (record.arrival - send)": [r["arrival"] - c.sent for c, r in whole],
        "  way out (first chunk - first token)": [c.chunk_times[0] - r["first_token"] for c, r in whole],
        "ITL, client (chunk gaps)": [b - a for c, _ in whole for a, b in zip(c.chunk_times, c.chunk_times[1:])],
        "ITL, testbed (token gaps)": [b - a for _, r in whole for a, b in zip(r["token_times"], r["token_times"][1:])],
        "ITL added by HTTP (client gap - testbed gap)": [
            (cb - ca) - (tb - ta) for c, r in whole
            for ca, cb, ta, tb in zip(c.chunk_times, c.chunk_times[1:], r["token_times"], r["token_times"][1:])],
        "token way out (chunk - token time), all": [t - s for c, r in whole
                                                     for t, s in zip(c.chunk_times, r["token_times"])],
    }
    serve = summary["serve"]
    print(f"{args.clients} clients x {args.tokens} tokens, cap {serve['cap']}: {len(clients) - len(errors)} "
          f"completed, {len(errors)} errors, {sum(r['aborted'] for r in records.values())} aborted records, "
          f"{len(records)} records; clients' wall {wall:.2f} s; {len(whole)} requests matched token by token")
    print(f"testbed: median TPOT {serve['measured']['median_tpot_ms']:.2f} ms (light-load prediction, the wall: "
          f"{serve['wall_tpot_ms']:.2f} ms), median TTFT {serve['measured']['median_ttft_ms']:.2f} ms")
    print(f"{'ms':46s} {'median':>9s} {'mean':>9s} {'p99':>9s}")
    for name, values in rows.items():
        print(f"{name:46s} {percentiles(values)}")
    for client in errors[:5]:
        print(f"error: client {client.index} ({client.id or 'no id'}): {client.error or client.finish_reason}")
    if args.save:
        with args.save.open("w") as f:
            for c, r in matched:
                f.write(json.dumps({"client": asdict(c), "record": r}) + "\n")
        print(f"saved: {args.save}")
    return 0 if not errors and len(records) == args.clients else 1


if __name__ == "__main__":
    sys.exit(main())
