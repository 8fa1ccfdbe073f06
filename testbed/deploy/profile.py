"""[[stages]] profile = "FILE.toml": a stage's forward pass as measured, in place of the roofline (issue 28).

The file (a path relative to the scenario's own file; to the working directory for a built-in or --set):

    source = "vLLM 0.6.3 on 8 x H100 SXM, Llama-3.1-70B, 2 of 80 layers + head, measured 2025-..."
    tokens = [1, 128, 2048]        # T: positions a pass computes (a decode step is 1; a prefill block is P)
    batch = [1, 8, 32]             # b: streams in the pass (continuous batching)
    ms = [[21.0, 22.4, 27.0],      # a row per T, a column per b: ms of one forward pass
          [35.0, 80.0, 260.0],
          [420.0, 3300.0, 13100.0]]

testbed.core.roofline.MeasuredProfile interpolates it; every error names the file and the key.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from testbed.core.errors import ConfigError
from testbed.core.roofline import MeasuredProfile
from testbed.scenario.validate import check_keys, check_number, check_text

PROFILE_KEYS = {"source", "tokens", "batch", "ms"}
MAX_POINTS = 64


def profile_path(text: str, scenario_source: str) -> Path:
    """The profile's file: relative to the scenario's file, or (a built-in, a dict, --set) the working directory."""
    path = Path(text)
    if not path.is_absolute() and scenario_source.endswith(".toml"):
        path = Path(scenario_source).parent / path
    return path


def load_profile(text: str, scenario_source: str, key: str) -> MeasuredProfile:
    path = profile_path(text, scenario_source)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read the profile {str(path)!r}: {exc.strerror}", source=scenario_source,
                          key=key) from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"not valid TOML: {exc}", source=str(path)) from exc
    return parse_profile(data, str(path))


def parse_profile(data: dict, source: str) -> MeasuredProfile:
    check_keys(data, PROFILE_KEYS, source, "")
    missing = sorted(PROFILE_KEYS - data.keys())
    if missing:
        raise ConfigError("missing key (a profile is source, tokens, batch and ms)", source=source, key=missing[0])
    check_text(data["source"], source, "source")
    tokens, batch = (_axis(data[name], source, name) for name in ("tokens", "batch"))
    grid = data["ms"]
    if not isinstance(grid, list) or len(grid) != len(tokens) \
            or not all(isinstance(row, list) and len(row) == len(batch) for row in grid):
        raise ConfigError(f"expected {len(tokens)} rows (one per tokens value) of {len(batch)} ms (one per batch "
                          "value)", source=source, key="ms")
    for i, row in enumerate(grid):
        for j, value in enumerate(row):
            check_number(value, source, f"ms[{i}][{j}]", minimum=0, maximum=3_600_000)
    return MeasuredProfile(data["source"], tokens, batch, tuple(tuple(float(v) for v in row) for row in grid))


def _axis(values: object, source: str, key: str) -> tuple[float, ...]:
    if not isinstance(values, list) or not 1 <= len(values) <= MAX_POINTS:
        raise ConfigError(f"expected an array of 1 to {MAX_POINTS} values", source=source, key=key)
    for i, value in enumerate(values):
        check_number(value, source, f"{key}[{i}]", minimum=1, integer=True)
    if any(b <= a for a, b in zip(values, values[1:])):
        raise ConfigError(f"expected strictly ascending values, got {values}", source=source, key=key)
    return tuple(float(v) for v in values)
