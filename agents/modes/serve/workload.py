"""A serving workload's requests, seeded: open-loop arrival times and prompt/output lengths (RequestSpec), made from
a WorkloadSpec (as `vllm bench serve`'s --request-rate, --burstiness and its random dataset) or replayed from a trace.

The arrivals, the prompt lengths and the output lengths each draw from their own stream (numpy SeedSequence(seed)
spawned three ways), and a rate scales the same standard draws: one seed gives the same request lengths, and the
same arrival pattern stretched, at every rate of a sweep (common random numbers), so two rates differ by the rate.
"""

from __future__ import annotations

import csv
import dataclasses
import datetime
import json
import math
from dataclasses import dataclass
from pathlib import Path


from agents.modes.serve.requests import RequestSpec

ARRIVALS = ("poisson", "gamma", "constant", "trace")
LENGTHS = ("fixed", "uniform", "normal", "lognormal")
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")  # the public Azure LLM inference trace's CSV
FITTED = "requests do not fit the model's context"  # what the run's notice of the requests `fitted` clipped says


class TraceError(ValueError):
    """A trace file cannot be replayed: the message names the file, the line and what is wrong."""


@dataclass(frozen=True)
class WorkloadSpec:
    """The requests of a serving run: how they arrive, how long their prompts and outputs are, how many, the seed."""

    arrival: str = "poisson"  # poisson | gamma | constant | trace
    rate: float = 1.0  # requests/s (not read for a trace)
    burstiness: float = 1.0  # gamma's shape b: gaps Gamma(b, 1 / (rate b)), vLLM's --burstiness; 1 = Poisson
    trace: str = ""  # the file a "trace" workload replays (tokens and times), "" otherwise
    prompt: str = "fixed"  # fixed | uniform | normal | lognormal
    prompt_tokens: int = 128  # the fixed length, or the distribution's mean
    prompt_spread: float = 0.0  # uniform: half-width; normal: sigma; lognormal: sigma of the log (mean kept)
    output: str = "fixed"
    output_tokens: int = 128
    output_spread: float = 0.0
    requests: int = 100  # how many (0: as many as arrive within duration_s); a trace: its first ones (0: all)
    duration_s: float = 0.0  # arrivals in [0, duration_s) (0: use requests); a trace: its rows before it (0: all)
    max_concurrency: int = 0  # at most this many requests in the ring at once (0: no limit); the runner applies it
    seed: int = 0

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """Raise ValueError naming the first field that is out of its range."""
        def bad(name: str, expected: str) -> ValueError:
            return ValueError(f"workload.{name}: expected {expected}, got {getattr(self, name)!r}")

        if self.arrival not in ARRIVALS:
            raise bad("arrival", "one of " + ", ".join(ARRIVALS))
        if not _positive(self.rate):
            raise bad("rate", "a number > 0 (requests/s)")
        if not _positive(self.burstiness):
            raise bad("burstiness", "a number > 0 (1 is Poisson)")
        if not isinstance(self.trace, str) or (self.arrival == "trace") != bool(self.trace):
            raise bad("trace", "a file path when arrival = 'trace', and '' otherwise")
        for part in ("prompt", "output"):
            if getattr(self, part) not in LENGTHS:
                raise bad(part, "one of " + ", ".join(LENGTHS))
            if not _integer(getattr(self, f"{part}_tokens"), low=1):
                raise bad(f"{part}_tokens", "an integer >= 1")
            spread = getattr(self, f"{part}_spread")
            if not (isinstance(spread, int | float) and not isinstance(spread, bool) and 0 <= spread < math.inf):
                raise bad(f"{part}_spread", "a number >= 0")
        for name in ("requests", "max_concurrency", "seed"):
            if not _integer(getattr(self, name), low=0):
                raise bad(name, "an integer >= 0")
        if not (isinstance(self.duration_s, int | float) and 0 <= self.duration_s < math.inf):
            raise bad("duration_s", "a number >= 0 (seconds)")
        if self.arrival != "trace" and (self.requests > 0) == (self.duration_s > 0):
            raise bad("requests", f"exactly one of requests and duration_s > 0 (duration_s = {self.duration_s!r})")


def fitted(spec: RequestSpec, context: int) -> RequestSpec:
    """The request as the model computes it within its context of `context` positions: its output at most half the
    context, its prompt at most the rest (the runner's model reads the last tokens of the prompt asked for)."""
    output = min(spec.output_tokens, context // 2)
    return dataclasses.replace(spec, prompt_tokens=min(spec.prompt_tokens, context - output), output_tokens=output)


def check_fits(spec: WorkloadSpec, context: int, model: str) -> None:
    """A fixed length that no request can have within the model's context raises ValueError naming
    workload.<key> and the limit (the serve mode emulates no longer context). Drawn lengths and a trace's may pass
    it: the runner fits those one by one (fitted) and says how many it clipped."""
    half = context // 2
    if spec.output == "fixed" and spec.output_tokens > half:
        raise ValueError(f"workload.output_tokens: {spec.output_tokens} output tokens do not fit the model's context "
                         f"({model}: {context} positions; a request's output may take at most half of it, {half} "
                         f"tokens)")
    least_output = min(spec.output_tokens, half) if spec.output == "fixed" else 1
    if spec.prompt == "fixed" and spec.prompt_tokens + least_output > context:
        raise ValueError(f"workload.prompt_tokens: a prompt of {spec.prompt_tokens} tokens and {least_output} output "
                         f"tokens do not fit the model's context ({model}: {context} positions): at most "
                         f"{context - least_output} prompt tokens (the serve mode emulates no longer context)")


def _positive(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and 0 < value < math.inf


def _integer(value: object, *, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def generate(spec: WorkloadSpec, *, max_prompt: int, max_output: int) -> list[RequestSpec]:
    """The workload's requests in arrival order. Poisson and gamma arrive at the sum of the gaps drawn so far (the
    first one after the first gap, as vLLM); constant at i / rate. Lengths (a trace's too) are integers clipped to
    [1, max_prompt] and [1, max_output]: the model's context bounds them."""
    import numpy as np  # here, not at the top: the mode's card imports this module's WorkloadSpec

    if max_prompt < 1 or max_output < 1:
        raise ValueError(f"generate: max_prompt and max_output must be >= 1, got {max_prompt}, {max_output}")
    if spec.arrival == "trace":
        rows = read_trace(spec.trace)
        if spec.duration_s > 0:
            rows = [r for r in rows if r.arrival_s < spec.duration_s]
        if spec.requests > 0:
            rows = rows[:spec.requests]
        return [RequestSpec(index=i, arrival_s=r.arrival_s, prompt_tokens=min(r.prompt_tokens, max_prompt),
                            output_tokens=min(r.output_tokens, max_output)) for i, r in enumerate(rows)]
    arrival_rng, prompt_rng, output_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(spec.seed).spawn(3))
    arrivals = _arrivals(spec, arrival_rng)
    prompts = _lengths(spec.prompt, spec.prompt_tokens, spec.prompt_spread, len(arrivals), max_prompt, prompt_rng)
    outputs = _lengths(spec.output, spec.output_tokens, spec.output_spread, len(arrivals), max_output, output_rng)
    return [RequestSpec(index=i, arrival_s=float(t), prompt_tokens=int(p), output_tokens=int(o))
            for i, (t, p, o) in enumerate(zip(arrivals, prompts, outputs, strict=True))]


def _arrivals(spec: WorkloadSpec, rng: np.random.Generator) -> np.ndarray:
    """Arrival times (s): `requests` of them, or every one before duration_s (gaps drawn in chunks, deterministic)."""
    import numpy as np  # here, not at the top: the mode's card imports this module's WorkloadSpec

    if spec.arrival == "constant":
        count = spec.requests if spec.requests > 0 else math.ceil(spec.duration_s * spec.rate)
        times = np.arange(count) / spec.rate
        return times[times < spec.duration_s] if spec.duration_s > 0 else times

    def gaps(n: int) -> np.ndarray:  # standard draws scaled by the rate: one pattern at every rate
        if spec.arrival == "poisson":
            return rng.standard_exponential(n) / spec.rate
        return rng.standard_gamma(spec.burstiness, n) / (spec.rate * spec.burstiness)

    if spec.requests > 0:
        return np.cumsum(gaps(spec.requests))
    chunk = max(64, math.ceil(spec.duration_s * spec.rate * 1.1))
    times = np.cumsum(gaps(chunk))
    while times[-1] < spec.duration_s:
        times = np.concatenate([times, times[-1] + np.cumsum(gaps(chunk))])
    return times[times < spec.duration_s]


def _lengths(kind: str, mean: int, spread: float, count: int, bound: int, rng: np.random.Generator) -> np.ndarray:
    import numpy as np

    if kind == "fixed":
        drawn = np.full(count, float(mean))
    elif kind == "uniform":
        drawn = rng.integers(round(mean - spread), round(mean + spread), size=count, endpoint=True).astype(float)
    elif kind == "normal":
        drawn = rng.normal(mean, spread, size=count)
    else:  # lognormal with mean `mean`: E[exp(N(mu, s))] = exp(mu + s^2 / 2)
        drawn = rng.lognormal(math.log(mean) - spread ** 2 / 2, spread, size=count)
    return np.clip(np.rint(drawn), 1, bound).astype(np.int64)


def read_trace(path: str | Path) -> list[RequestSpec]:
    """A trace's requests, sorted by arrival, times from the first request (= 0). Two formats: JSON lines of
    {"arrival_s" (or "timestamp"): seconds, "prompt_tokens": int, "output_tokens": int} (other keys ignored), and
    the public Azure LLM inference trace's CSV (TIMESTAMP as "2023-11-16 18:15:46.6805900", ContextTokens,
    GeneratedTokens; a row that generated 0 tokens replays as 1: a request ends at its first token at the
    earliest). A malformed line raises TraceError naming the file and the line."""
    path = Path(path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(f"{path}: cannot read the trace: {exc}") from exc
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    if not first:
        raise TraceError(f"{path}: the trace holds no requests (the file is empty)")
    rows = _read_json_lines(path, text) if first.startswith("{") else _read_azure_csv(path, text)
    if not rows:
        raise TraceError(f"{path}: the trace holds no requests")
    rows.sort(key=lambda row: row[0])  # stable: rows at the same time keep the file's order
    start = rows[0][0]
    return [RequestSpec(index=i, arrival_s=t - start, prompt_tokens=p, output_tokens=o)
            for i, (t, p, o) in enumerate(rows)]


def _read_json_lines(path: Path, text: str) -> list[tuple[float, int, int]]:
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TraceError(f"{where}: not a JSON object: {exc.msg}") from exc
        if not isinstance(row, dict):
            raise TraceError(f"{where}: expected a JSON object, got {type(row).__name__}")
        key = "arrival_s" if "arrival_s" in row else "timestamp"
        if key not in row:
            raise TraceError(f"{where}: missing arrival_s (or timestamp)")
        arrival = row[key]
        if not isinstance(arrival, int | float) or isinstance(arrival, bool) or not math.isfinite(arrival):
            raise TraceError(f"{where}: {key}: expected a number of seconds, got {arrival!r}")
        tokens = []
        for name in ("prompt_tokens", "output_tokens"):
            value = row.get(name)
            if not _integer(value, low=1):
                raise TraceError(f"{where}: {name}: expected an integer >= 1, got {value!r}")
            tokens.append(value)
        rows.append((float(arrival), tokens[0], tokens[1]))
    return rows


def _read_azure_csv(path: Path, text: str) -> list[tuple[float, int, int]]:
    reader = csv.DictReader(text.splitlines())
    missing = [c for c in AZURE_COLUMNS if c not in (reader.fieldnames or [])]
    if missing:
        raise TraceError(f"{path}:1: neither JSON lines nor the Azure trace's CSV: missing column(s) "
                         f"{', '.join(missing)} (header {reader.fieldnames})")
    rows, origin = [], None
    for row in reader:
        where = f"{path}:{reader.line_num}"
        stamp = _azure_timestamp(row["TIMESTAMP"], where)
        origin = origin or stamp
        seconds = (stamp[0] - origin[0]).total_seconds() + (stamp[1] - origin[1])
        tokens = []
        for name in AZURE_COLUMNS[1:]:
            value = (row[name] or "").strip()
            if not value.isdigit():
                raise TraceError(f"{where}: {name}: expected an integer >= 0, got {row[name]!r}")
            tokens.append(max(1, int(value)))
        rows.append((seconds, tokens[0], tokens[1]))
    return rows


def _azure_timestamp(text: str | None, where: str) -> tuple[datetime.datetime, float]:
    """(the whole second, the fraction of it): datetime holds microseconds, the trace's stamps carry 7 digits."""
    whole, _, fraction = (text or "").strip().partition(".")
    try:
        second = datetime.datetime.strptime(whole.replace("T", " "), "%Y-%m-%d %H:%M:%S")
    except ValueError as exc:
        raise TraceError(f"{where}: TIMESTAMP: expected a time like 2023-11-16 18:15:46.6805900, got {text!r}") from exc
    if fraction and not fraction.isdigit():
        raise TraceError(f"{where}: TIMESTAMP: expected digits after the seconds' point, got {text!r}")
    return second, int(fraction) / 10 ** len(fraction) if fraction else 0.0
