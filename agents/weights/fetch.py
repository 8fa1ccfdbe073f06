"""A node's side: fetch files from an origin (agents.weights.origin), every chunk verified, resumable.

`fetch_file` takes one file of the manifest into `dest`:

- the chunks not yet verified are split into `streams` contiguous ranges, one Range request each, in parallel;
- each chunk's bytes are checked against the manifest's SHA-256 as they complete, written in place into
  `NAME.partial` and recorded in `NAME.progress` (one verified chunk index a line, appended as it lands);
- a chunk whose hash is wrong is dropped and fetched again, up to `attempts` times; then FetchError names it;
- a rerun after a killed transfer re-hashes the chunks the progress file names (a chunk that no longer matches is
  fetched again) and fetches only the rest;
- once every chunk is verified the partial file becomes NAME and the progress file goes: no file under its final
  name ever holds an unverified byte.
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import httpx2
import trio

from agents.weights import verified
from agents.weights.manifest import FileEntry, parse

ATTEMPTS = 3
READ_TIMEOUT_S = 600.0


class FetchError(RuntimeError):
    """A transfer that could not complete: which file and chunk, and why."""


@dataclass
class FetchReport:
    name: str
    size: int
    fetched_bytes: int = 0  # bytes that crossed the network for it this time
    fetched_chunks: int = 0
    resumed_chunks: int = 0  # verified by an earlier, killed transfer
    refetched_chunks: int = 0  # a hash that did not match: fetched again
    seconds: float = 0.0
    verified_at: float = 0.0  # the box's monotonic clock when its last chunk was verified (before the fsync)


def ranges(chunks: list[int], streams: int) -> list[list[int]]:
    """`chunks` (sorted indices) cut into at most `streams` runs of about equal length, one Range request each: a
    run is contiguous, or two neighbours merged when there are more gaps than streams (its request then covers the
    verified chunks between them too, fetched again)."""
    runs: list[list[int]] = []
    for index in chunks:
        if runs and runs[-1][-1] == index - 1:
            runs[-1].append(index)
        else:
            runs.append([index])
    while len(runs) < streams and max((len(r) for r in runs), default=0) > 1:
        longest = max(range(len(runs)), key=lambda i: len(runs[i]))
        run = runs.pop(longest)
        runs[longest:longest] = [run[:len(run) // 2], run[len(run) // 2:]]
    while len(runs) > streams:  # more gaps than streams: the shortest neighbours share a request each
        i = min(range(len(runs) - 1), key=lambda i: len(runs[i]) + len(runs[i + 1]))
        runs[i:i + 2] = [runs[i] + runs[i + 1]]
    return runs


def _verified(entry: FileEntry, partial: Path, progress: Path) -> set[int]:
    """The chunks a killed transfer verified and that still match (re-hashed from the partial file)."""
    if not partial.is_file() or not progress.is_file():
        return set()
    good = set()
    with partial.open("rb") as f:
        for line in progress.read_text().split():
            if line.isdigit() and int(line) < len(entry.chunks):
                start, end = entry.span(int(line))
                f.seek(start)
                if hashlib.sha256(f.read(end - start)).hexdigest() == entry.chunks[int(line)]:
                    good.add(int(line))
    return good


class _Writer:
    """Verified chunks into the partial file, each recorded in the progress file as it lands."""

    def __init__(self, entry: FileEntry, partial: Path, progress: Path, report: FetchReport) -> None:
        self.entry, self.report = entry, report
        self.fd = os.open(partial, os.O_RDWR | os.O_CREAT, 0o644)
        os.ftruncate(self.fd, entry.size)
        self.progress = progress.open("a")
        self.bad: list[int] = []

    def chunk(self, index: int, data: bytes) -> None:
        self.report.fetched_bytes += len(data)
        if hashlib.sha256(data).hexdigest() != self.entry.chunks[index]:
            self.bad.append(index)
            return
        os.pwrite(self.fd, data, self.entry.span(index)[0])
        self.progress.write(f"{index}\n")
        self.progress.flush()
        self.report.fetched_chunks += 1
        self.report.verified_at = time.monotonic()

    def close(self) -> None:
        os.fsync(self.fd)
        os.close(self.fd)
        self.progress.close()


async def _fetch_run(client: httpx2.AsyncClient, entry: FileEntry, run: list[int], writer: _Writer,
                     tamper: Callable[[str, int, bytes], bytes] | None) -> None:
    start, end = entry.span(run[0])[0], entry.span(run[-1])[1]
    headers = {"Range": f"bytes={start}-{end - 1}"}
    async with client.stream("GET", f"/files/{entry.name}", headers=headers) as response:
        if response.status_code not in (200, 206):
            raise FetchError(f"{entry.name}: the origin answered {response.status_code} to {headers['Range']}")
        offset = 0 if response.status_code == 200 else start  # a 200 is the whole file
        buffer, index = bytearray(), run[0]
        async for block in response.aiter_bytes():
            if offset < start:  # a whole-file answer: skip to the range
                skip = min(len(block), start - offset)
                block, offset = block[skip:], offset + skip
            buffer += block
            offset += len(block)
            while index <= run[-1] and len(buffer) >= (size := entry.span(index)[1] - entry.span(index)[0]):
                data = bytes(buffer[:size])
                del buffer[:size]
                writer.chunk(index, tamper(entry.name, index, data) if tamper else data)
                index += 1
            if index > run[-1]:
                break
    if index <= run[-1]:
        raise FetchError(f"{entry.name}: the origin's answer ended before chunk {index}")


async def fetch_file(client: httpx2.AsyncClient, entry: FileEntry, dest: Path, *, streams: int = 8,
                     attempts: int = ATTEMPTS, tamper: Callable[[str, int, bytes], bytes] | None = None) -> FetchReport:
    """Fetch `entry` from the origin `client` talks to into `dest` (see the module doc); `tamper` (tests) may change a
    chunk's bytes as they arrive, as a corrupting network would."""
    began = time.monotonic()
    report = FetchReport(entry.name, entry.size)
    final, partial, progress = dest / entry.name, dest / f"{entry.name}.partial", dest / f"{entry.name}.progress"
    done = _verified(entry, partial, progress)
    report.resumed_chunks = len(done)
    missing = [i for i in range(len(entry.chunks)) if i not in done]
    writer = _Writer(entry, partial, progress, report)
    try:
        for attempt in range(attempts):
            if not missing:
                break
            async with trio.open_nursery() as nursery:
                for run in ranges(missing, streams):
                    nursery.start_soon(_fetch_run, client, entry, run, writer, tamper)
            missing, writer.bad = sorted(writer.bad), []
            report.refetched_chunks += len(missing)
        if missing:
            raise FetchError(f"{entry.name}: chunk {missing[0]} failed its SHA-256 check {attempts} times")
    finally:
        writer.close()
    os.replace(partial, final)
    progress.unlink(missing_ok=True)
    report.seconds = time.monotonic() - began
    return report


async def fetch(base_url: str, dest: Path, names: list[str] | None = None, *, streams: int = 8,
                tamper: Callable[[str, int, bytes], bytes] | None = None,
                began: list[float] | None = None) -> list[FetchReport]:
    """Fetch `names` (default: every file of the origin's manifest) into `dest`, one file after another, and add
    them to dest's record of verified files (agents.weights.verified); `began` gets the moment the first request
    left (the client's own set-up, its TLS context among it, is not the network's)."""
    dest.mkdir(parents=True, exist_ok=True)
    limits = httpx2.Limits(max_connections=streams, max_keepalive_connections=streams)
    async with httpx2.AsyncClient(base_url=base_url, limits=limits, timeout=READ_TIMEOUT_S) as client:
        if began is not None:
            began.append(time.monotonic())
        response = await client.get("/manifest.json")
        response.raise_for_status()
        entries = parse(response.content)
        unknown = sorted(set(names or ()) - set(entries))
        if unknown:
            raise FetchError(f"the origin has no {', '.join(unknown)}")
        wanted = names or list(entries)
        reports = [await fetch_file(client, entries[name], dest, streams=streams, tamper=tamper) for name in wanted]
    verified.record(dest, [entries[name] for name in wanted])  # what an agent re-checks before it loads them
    return reports


def main(argv: list[str] | None = None) -> int:
    """`python -m agents.weights.fetch URL DEST [--names A,B] [--streams P] [--go]`: fetch, then print one JSON line:
    the reports, and when the fetch began and ended (the box's monotonic clock, which every network namespace
    shares). With --go it first prints {"ready": true} and waits for a line on stdin, so that several nodes start
    together (testbed.launch.weights)."""
    import argparse
    import json
    import sys
    from dataclasses import asdict

    parser = argparse.ArgumentParser(prog="python -m agents.weights.fetch", description=main.__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("dest", type=Path)
    parser.add_argument("--names", default="", help="comma-separated file names (default: every file)")
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--go", action="store_true", help="wait for a line on stdin before fetching")
    args = parser.parse_args(argv)
    if args.streams < 1:
        parser.error(f"--streams must be at least 1, got {args.streams}")
    names = [n for n in args.names.split(",") if n] or None
    if args.go:
        print(json.dumps({"ready": True}), flush=True)
        if not sys.stdin.readline():
            return 1
    began: list[float] = []
    try:
        reports = trio.run(lambda: fetch(args.url, args.dest, names, streams=args.streams, began=began))
    except (FetchError, httpx2.HTTPError, OSError) as exc:
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}), flush=True)
        return 1
    ended = max((r.verified_at for r in reports if r.fetched_chunks), default=began[0])  # the network's part
    print(json.dumps({"began": began[0], "ended": ended, "reports": [asdict(r) for r in reports]}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
