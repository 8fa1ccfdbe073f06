"""The serve mode's own keys, in the scenario's [workload] table: the requests (agents.modes.serve.workload's
WorkloadSpec, seeded), the concurrency cap and the SLO targets (vLLM's --goodput form)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from agents.modes.serve.workload import ARRIVALS, LENGTHS, WorkloadSpec
from testbed.core.settings import ModeSettings, SettingError, between, one_of, setting, text

MAX_RATE = 1e6  # requests/s
MAX_REQUESTS = 10_000_000
MAX_DURATION_S = 30 * 86_400.0
MAX_TOKENS = 1_000_000  # a request's prompt or output as the workload draws it (the model's context clips it)


@dataclass(frozen=True)
class ServeSettings(ModeSettings):
    """[workload]: how requests arrive (poisson at `rate`, gamma with `burstiness` as vLLM's --burstiness, constant,
    or a `trace` replayed), their prompt and output lengths (fixed, uniform, normal, lognormal: the length and its
    spread), how many (`requests`, or every arrival within `duration_s`), at most `max_concurrency` in the ring at
    once (0: decode.streams, the ring's cap), the seed, and the SLO (`goodput`: "ttft:MS tpot:MS e2el:MS").

    Time: `rate`, `duration_s` and `trace_scale` are durations of the scenario; time dilation D runs every
    duration D times as long (testbed.launch.dilation), so time_scaled(D) divides the rate by D and multiplies the
    duration and a trace's arrival times by D: the arrivals keep their place among the laps."""

    TABLE: ClassVar[str] = "workload"

    arrival: str = setting("poisson", one_of(*ARRIVALS))
    rate: float = setting(1.0, between(0.0, MAX_RATE))  # requests/s (> 0: check)
    burstiness: float = setting(1.0, between(0.0, 1e3))  # gamma's shape (> 0: check); 1 = Poisson
    trace: str = setting("", text())  # a JSON-lines or Azure CSV trace (arrival = "trace")
    trace_scale: float = setting(1.0, between(1e-6, 1e6))  # a trace's arrival times are multiplied by this
    prompt: str = setting("fixed", one_of(*LENGTHS))
    prompt_tokens: int = setting(128, between(1, MAX_TOKENS, integer=True))
    prompt_spread: float = setting(0.0, between(0.0, MAX_TOKENS))
    output: str = setting("fixed", one_of(*LENGTHS))
    output_tokens: int = setting(32, between(1, MAX_TOKENS, integer=True))
    output_spread: float = setting(0.0, between(0.0, MAX_TOKENS))
    requests: int = setting(100, between(0, MAX_REQUESTS, integer=True))  # 0: every arrival within duration_s
    duration_s: float = setting(0.0, between(0.0, MAX_DURATION_S))  # 0: `requests` of them
    max_concurrency: int = setting(0, between(0, 1 << 20, integer=True))  # 0: decode.streams
    seed: int = setting(0, between(0, 2**63 - 1, integer=True))
    goodput: str = setting("", text())  # vLLM's --goodput: "ttft:300 tpot:50" ("" : no targets)

    def check(self) -> None:
        if self.rate <= 0:
            raise SettingError("rate", f"expected a number > 0 (requests/s), got {self.rate!r}")
        if self.burstiness <= 0:
            raise SettingError("burstiness", f"expected a number > 0 (1 is Poisson), got {self.burstiness!r}")
        if self.goodput:
            from agents.modes.serve.slo import Goodput

            try:
                Goodput.parse(self.goodput)
            except ValueError as exc:
                raise SettingError("goodput", str(exc)) from exc
        if self.arrival != "trace" and not self.requests and not self.duration_s:
            return  # no requests of its own: the endpoint's only ([endpoint], the runner checks there is one)
        try:
            self.workload()
        except ValueError as exc:  # WorkloadSpec.check names the field as workload.<name>
            key = str(exc).partition(":")[0].removeprefix("workload.")
            raise SettingError(key if key in {f.name for f in dataclasses.fields(self)} else "arrival",
                               str(exc).partition(": ")[2] or str(exc)) from exc

    def fixed_decode(self) -> dict[str, Any]:
        """The serve mode moves its running requests as one convoy (continuous batching)."""
        return {"batching": "continuous"}

    def time_scaled(self, factor: float) -> ServeSettings:
        """The workload `factor` times as slow: every arrival gap and the duration times `factor`."""
        return dataclasses.replace(self, rate=self.rate / factor, duration_s=self.duration_s * factor,
                                   trace_scale=self.trace_scale * factor)

    def workload(self) -> WorkloadSpec:
        """The workload's spec (agents.modes.serve.workload.generate makes its requests; a trace's arrival times are
        then multiplied by trace_scale, and its duration_s is of the trace's own times)."""
        return WorkloadSpec(arrival=self.arrival, rate=self.rate, burstiness=self.burstiness, trace=self.trace,
                            prompt=self.prompt, prompt_tokens=self.prompt_tokens, prompt_spread=self.prompt_spread,
                            output=self.output, output_tokens=self.output_tokens, output_spread=self.output_spread,
                            requests=self.requests,
                            duration_s=self.duration_s / self.trace_scale if self.arrival == "trace" else self.duration_s,
                            max_concurrency=self.max_concurrency, seed=self.seed)

    def goodput_targets(self):
        """The SLO targets (slo.Goodput), or None where none are set."""
        from agents.modes.serve.slo import Goodput

        return Goodput.parse(self.goodput) if self.goodput else None


@dataclass(frozen=True)
class EndpointSettings(ModeSettings):
    """[endpoint]: the serve mode's OpenAI-compatible HTTP endpoint on the entry (agents.modes.serve.endpoint), for
    the real-time backends (`testbed run ... --http [HOST:]PORT --api-key KEY`). `port` 0: no endpoint. With one,
    the run serves HTTP requests beside the workload's own (none: workload.requests = 0) for `serve_s` seconds, or
    until it is stopped (Ctrl-C) where serve_s is 0, then lets the requests in the ring end."""

    TABLE: ClassVar[str] = "endpoint"

    host: str = setting("127.0.0.1", text())  # 127.0.0.1 unless told otherwise (vLLM's default is all addresses)
    port: int = setting(0, between(0, 65_535, integer=True))
    api_key: str = setting("", text())  # set: every request needs `Authorization: Bearer <api_key>` (401 without)
    serve_s: float = setting(0.0, between(0.0, MAX_DURATION_S))  # how long it takes requests; 0: until stopped

    def check(self) -> None:
        if not self.host:
            raise SettingError("host", "expected an address to bind, e.g. 127.0.0.1")

    def time_scaled(self, factor: float) -> EndpointSettings:
        return self  # HTTP clients live on the box's clock: the endpoint is never dilated (the CLI runs it at D = 1)


@dataclass(frozen=True)
class ServeSpecSettings(ModeSettings):
    """Speculation while serving ([decode] speculate = K): every running request drafts K tokens a lap with
    decode.draft (its own draft cache), the convoy carries each one's [last token, K drafts], and the return verifies
    them with the exact rule (agents.modes.speculative.verify). 0: plain decode."""

    speculate: int = setting(0, between(0, 64, integer=True))
