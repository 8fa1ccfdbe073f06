"""A guidellm Poisson benchmark against the endpoint on the geo ring, end to end and offline (issue 54: "a guidellm
Poisson run against the geo ring completes with 0 errors and its median ITL is within 3% of the predicted TPOT").

A script, not a test (real time on a shared box): it starts `testbed run geo-ring --http` on the userspace shaper,
runs `guidellm run` (the `guidellm` extra) with a Poisson profile and synthetic prompts against it, waits for the run's
JSON summary, and sets guidellm's figures beside the testbed's own records of the same requests (guidellm's
response_id "cmpl-<index>" is RequestRecord.index) and the light-load prediction, the wall C + T_ring.

Nothing downloads: guidellm's synthetic data needs a Hugging Face tokenizer to count and cut prompts, and the ring's
models are byte-level (agents.zoo.configs.BYTES: token id = UTF-8 byte), so the script writes one with the
`tokenizers` package (a byte-level BPE with the 256 bytes and no merges: GPT-2's byte alphabet, each byte's id its
value) into a temporary directory and passes its path; HF_HUB_OFFLINE, HF_DATASETS_OFFLINE and TRANSFORMERS_OFFLINE
are set for guidellm. guidellm's start-up check (GET /health, which the endpoint answers as vLLM does) is left off
(validate_backend=false: the run was measured so); http2=false: the endpoint speaks HTTP/1.1 without TLS.

    .venv/bin/python -m tests.guidellm_run                   # 0.5 req/s, 12 requests, prompt 64, output 32 tokens
    .venv/bin/python -m tests.guidellm_run --rate 1 --requests 30

Exit status 0: guidellm counted 0 errors and its median ITL is within 3% of the predicted TPOT.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.test_prometheus_server import free_port
from tests.test_serve_http import Cli, cli_argv

ITL_TOLERANCE = 0.03  # the "within 3% of the predicted TPOT"
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
START_MARGIN_S = 30.0  # serve_s beyond the requests' expected span: guidellm's own start-up, a slow box


def gpt2_byte_alphabet() -> dict[int, str]:
    """GPT-2's printable stand-in of every byte (what a byte-level BPE's vocabulary is written in)."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    shifted = [b for b in range(256) if b not in kept]
    return {**{b: chr(b) for b in kept}, **{b: chr(256 + i) for i, b in enumerate(shifted)}}


def byte_tokenizer(directory: Path) -> Path:
    """A Hugging Face tokenizer (AutoTokenizer loads it) whose token ids are the text's UTF-8 bytes, as BYTES'."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from agents.zoo.configs import BYTES

    vocab = {char: byte for byte, char in gpt2_byte_alphabet().items()}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, model_max_length=1 << 20)
    sample = "geo ring: Hong Kong -> Dublin, 東京 ü"
    if fast.encode(sample, add_special_tokens=False) != BYTES.encode(sample):
        raise RuntimeError("the byte tokenizer's ids are not the ring's byte ids")
    fast.save_pretrained(directory)
    return directory


def guidellm_argv(port: int, tokenizer: Path, out: Path, args: argparse.Namespace, api_key: str) -> list[str]:
    guidellm = shutil.which("guidellm", path=str(Path(sys.executable).parent)) or "guidellm"
    return [guidellm, "run",
            "--backend", f"kind=openai_http,target=http://127.0.0.1:{port},request_format=/v1/completions,"
                         f"api_key={api_key},validate_backend=false,http2=false",
            "--profile", f"kind=poisson,rate={args.rate:g}",
            "--constraint", f"kind=max_requests,count={args.requests}",
            "--data", f"kind=synthetic_text,prompt_tokens={args.prompt_tokens},output_tokens={args.output_tokens}",
            "--tokenizer", f"kind=huggingface_auto,model={tokenizer}",
            "--output", f"kind=json,path={out}",
            "--disable-console-interactive"]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=0.5, help="Poisson arrivals, requests/s")
    parser.add_argument("--requests", type=int, default=12)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--output-tokens", type=int, default=32)
    parser.add_argument("--serve-s", type=float, default=0.0,
                        help="endpoint.serve_s (0: the requests' expected span plus a margin)")
    parser.add_argument("--keep", type=Path, help="keep guidellm's JSON and the run's summary in this directory")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="guidellm-run-"))
    out = (args.keep or work) / "guidellm.json"
    summary_path = (args.keep or work) / "summary.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    api_key = "sk-guidellm-run"
    wall_s = 0.4  # a generous lap for the margin only (geo-ring's wall is 313 ms)
    serve_s = args.serve_s or args.requests / args.rate + (args.output_tokens + 2) * wall_s + START_MARGIN_S
    port = free_port()
    try:
        tokenizer = byte_tokenizer(work / "byte-tokenizer")
        command = guidellm_argv(port, tokenizer, out, args, api_key)
        cli = Cli(cli_argv(port, "--api-key", api_key, "--set", f"endpoint.serve_s={serve_s:g}",
                           "--json", str(summary_path))).start()
        try:
            cli.wait_listening()
            print("$ " + " ".join(f"'{a}'" if " " in a or "," in a else a for a in command), flush=True)
            benchmark = subprocess.run(command, env={**os.environ, **OFFLINE}, cwd=work, stdin=subprocess.DEVNULL,
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            exit_code = cli.wait(serve_s + 120)
        finally:
            cli.stop()
        if benchmark.returncode != 0 or exit_code != 0:
            print(benchmark.stdout[-4000:], cli.output[-3000:], sep="\n", file=sys.stderr)
            return 1
        return report(json.loads(out.read_text()), json.loads(summary_path.read_text()))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def report(guide: dict, summary: dict) -> int:
    """guidellm's figures beside the testbed's records and the prediction; 0 when the issue's check holds."""
    run = guide["benchmarks"][0]
    metrics, requests = run["metrics"], run["requests"]
    totals = metrics["request_totals"]
    itl_ms = metrics["inter_token_latency_ms"]["successful"]["median"]
    ttft_ms = metrics["time_to_first_token_ms"]["successful"]["median"]
    serve = summary["serve"]
    predicted_ms = serve["wall_tpot_ms"]
    records = {r["index"]: r for r in serve["records"]}
    matched = [(req, records[int(req["response_id"].removeprefix("cmpl-"))]) for req in requests["successful"]
               if str(req.get("response_id", "")).startswith("cmpl-")]
    # guidellm's ITL of a request is its mean gap, (last token - first token) / (tokens - 1); the median is over
    # requests (each counted once a token): the testbed's TPOT is the same statistic of its own records
    record_tpot = [(r["token_times"][-1] - r["token_times"][0]) / (r["output_tokens"] - 1) for _, r in matched
                   if r["output_tokens"] > 1]
    client_tpot = [(t["last_token_iteration"] - t["first_token_iteration"]) / (r["output_tokens"] - 1)
                   for t, r in ((req["info"]["timings"], r) for req, r in matched) if r["output_tokens"] > 1]
    record_ttft = [r["first_token"] - r["arrival"] for _, r in matched]
    client_ttft = [req["info"]["timings"]["first_token_iteration"] - req["info"]["timings"]["request_start"]
                   for req, _ in matched]
    error = itl_ms / predicted_ms - 1
    queueing = serve["predicted"] or {}
    print(f"guidellm: {totals['successful']} completed, {totals['errored']} errored, {totals['incomplete']} "
          f"incomplete; {len(matched)} matched to the testbed's records")
    print(f"median ITL: guidellm {itl_ms:.2f} ms; predicted TPOT, the wall C + T_ring, {predicted_ms:.2f} ms: "
          f"{error * 100:+.2f}% ({'within' if abs(error) <= ITL_TOLERANCE else 'beyond'} {ITL_TOLERANCE:.0%}); the "
          f"queueing model at this load {queueing.get('median_tpot_ms', float('nan')):.2f} ms")
    print(f"median TPOT of the same requests: testbed records {median(record_tpot) * 1e3:.2f} ms, guidellm's "
          f"timings {median(client_tpot) * 1e3:.2f} ms (HTTP adds "
          f"{median([c - t for c, t in zip(client_tpot, record_tpot)]) * 1e3:+.2f} ms a token)")
    print(f"median TTFT: guidellm {ttft_ms:.2f} ms, testbed records {median(record_ttft) * 1e3:.2f} ms (HTTP adds "
          f"{median([c - t for c, t in zip(client_ttft, record_ttft)]) * 1e3:+.2f} ms); light-load prediction "
          f"{serve['light_ttft_ms']:.2f} ms, the queueing model {queueing.get('median_ttft_ms', float('nan')):.2f} ms")
    return 0 if totals["errored"] == 0 and totals["incomplete"] == 0 and abs(error) <= ITL_TOLERANCE else 1


if __name__ == "__main__":
    sys.exit(main())
