"""[[network.schedule]]: a moving network - per-link changes over time, partitions, replayed delay traces.

Each entry names a directed link ("src->dst") and either:
- `at_s` and any of `delay_ms`, `jitter_ms`, `loss_pct`, `rate_mbit`: from at_s seconds on, the link has them;
- `at_s` and `down_s`: the link carries nothing from at_s for down_s seconds (a partition; a reliable transport
  delivers what was sent once it is back, in order);
- `trace`: a file of one-way delay samples to replay, one "t_s delay_ms" pair a line (seconds from the start,
  ascending; '#' starts a comment), Mahimahi-like: each sample sets the link's delay from its t_s on.
Times count from the moment the agents are told to run (the first probe lap), in the scenario's time; `scale`
multiplies them like every other time, and so does time dilation (Scenario.dilated).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed.core.errors import ConfigError
from testbed.core.records import JsonRecord
from testbed.scenario.validate import check_keys, number

SETTABLE = ("delay_ms", "jitter_ms", "loss_pct", "rate_mbit")
MAX_EVENTS = 100_000


@dataclass(frozen=True)
class LinkEvent(JsonRecord):
    """One change of one directed link at at_s seconds (scenario time): new values, or down for down_s."""

    src: int
    dst: int
    at_s: float
    delay_ms: float | None = None
    jitter_ms: float | None = None
    loss_pct: float | None = None
    rate_mbit: float | None = None
    down_s: float = 0.0

    @property
    def link(self) -> str:
        return f"{self.src}->{self.dst}"

    def describe(self) -> str:
        if self.down_s:
            return f"{self.link} down for {self.down_s:g} s"
        return f"{self.link} " + ", ".join(f"{k} {getattr(self, k):g}" for k in SETTABLE if getattr(self, k) is not None)

    def scaled(self, factor: float, rates: bool = False) -> "LinkEvent":
        """Times and delays times `factor` (scale); with `rates` (time dilation) link rates divided by it too."""
        return LinkEvent(self.src, self.dst, self.at_s * factor,
                         None if self.delay_ms is None else self.delay_ms * factor,
                         None if self.jitter_ms is None else self.jitter_ms * factor, self.loss_pct,
                         None if self.rate_mbit is None or not rates else self.rate_mbit / factor, self.down_s * factor)


def read_trace(path: Path, source: str, where: str) -> list[tuple[float, float]]:
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise ConfigError(f"cannot read trace file {str(path)!r}: {exc.strerror}", source=source, key=where) from exc
    samples = []
    for n, line in enumerate(lines, 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        try:
            t, delay = (float(x) for x in text.split())
        except ValueError:
            raise ConfigError(f"{path.name} line {n}: expected 't_s delay_ms', got {line.strip()!r}", source=source,
                              key=where) from None
        if t < 0 or delay < 0 or (samples and t <= samples[-1][0]) or len(samples) >= MAX_EVENTS:
            raise ConfigError(f"{path.name} line {n}: times must ascend from 0 and delays be >= 0 (at most "
                              f"{MAX_EVENTS} samples)", source=source, key=where)
        samples.append((t, delay))
    if not samples:
        raise ConfigError(f"trace file {path.name} has no samples", source=source, key=where)
    return samples


def parse_schedule(raw: Any, links: set[tuple[int, int]], source: str, scale: float) -> tuple[LinkEvent, ...]:
    """[[network.schedule]] -> events sorted by time (already scaled)."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ConfigError("expected an array of [[network.schedule]] tables", source=source, key="network.schedule")
    events = []
    for i, item in enumerate(raw):
        where = f"network.schedule[{i}]"
        if not isinstance(item, dict):
            raise ConfigError("expected a table", source=source, key=where)
        check_keys(item, {"link", "at_s", "down_s", "trace", *SETTABLE}, source, where)
        text = item.get("link")
        try:
            src, dst = (int(x) for x in str(text).split("->"))
        except ValueError:
            raise ConfigError(f"expected a link like \"0->1\", got {text!r}", source=source,
                              key=f"{where}.link") from None
        if (src, dst) not in links:
            raise ConfigError(f"no link {src}->{dst} in this scenario; links: "
                              f"{', '.join(f'{a}->{b}' for a, b in sorted(links))}", source=source, key=f"{where}.link")
        if "trace" in item:
            if len(item) != 2:
                raise ConfigError("a trace replaces every other key but link", source=source, key=f"{where}.trace")
            path = Path(str(item["trace"]))
            if not path.is_absolute() and source.endswith(".toml"):
                path = Path(source).parent / path  # relative to the scenario file
            events += [LinkEvent(src, dst, t, delay_ms=d).scaled(scale) for t, d in read_trace(path, source, where)]
            continue
        at = number(item, "at_s", -1.0, source, where, maximum=1e6)
        if at < 0:
            raise ConfigError("expected at_s, the seconds from the start when the change happens", source=source,
                              key=f"{where}.at_s")
        values = {k: number(item, k, 0.0, source, where, maximum=100 if k == "loss_pct" else 100_000)
                  for k in SETTABLE if k in item}
        down = number(item, "down_s", 0.0, source, where, maximum=1e6)
        if bool(values) == bool(down):
            raise ConfigError(f"expected either down_s or some of {', '.join(SETTABLE)}", source=source, key=where)
        events.append(LinkEvent(src, dst, at, down_s=down, **values).scaled(scale))
    return tuple(sorted(events, key=lambda e: e.at_s))
