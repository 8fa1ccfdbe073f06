"""The echo mode's part of the run log: every decode token the run log sees, and the bytes its laps echoed."""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily

from tests.echo_mode.facts import Echoed


class Echoes:
    """Fed every lap of every mode by the run log (the parts see each other's laps: speculation's rounds are dsd's
    too); counts the decode tokens, and the bytes an echo lap's facts say it carried."""

    name = "echoes"

    def __init__(self, scenario, lap_buckets, compute_buckets) -> None:
        self.decode_tokens = 0
        self.echoed_bytes = 0

    def add(self, records, compute, decode: bool) -> None:
        self.decode_tokens += sum(record.tokens for record in records) if decode else 0
        self.echoed_bytes += sum(isinstance(record.facts, Echoed) for record in records)

    @staticmethod
    def metrics(logs, current):
        parts = [log.parts[Echoes.name] for log in logs]
        yield CounterMetricFamily("testbed_echo_tokens", "Decode tokens the run logs saw",
                                  value=sum(part.decode_tokens for part in parts))
        yield CounterMetricFamily("testbed_echo_bytes", "Prompt bytes the echo laps carried",
                                  value=sum(part.echoed_bytes for part in parts))


PART = Echoes
