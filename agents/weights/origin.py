"""The origin: a checkpoint's files over HTTP, in hypercorn's Trio worker.

`GET /manifest.json` is the manifest (agents.weights.manifest); `GET /files/NAME` is the file, and a `Range` header
gets that range (Starlette's FileResponse: 206 with Content-Range). `serve_origin(root)` runs until cancelled and
reports its bound (host, port); `python -m agents.weights.origin ROOT` is the same as a process (it prints
`{"port": P}` once listening and warm; with --until-eof it stops when its stdin closes), for a backend whose nodes
live in network namespaces.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from functools import partial
from pathlib import Path

import trio
from hypercorn.config import Config
from hypercorn.trio import serve
from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from agents.weights import manifest


def build_app(root: Path, names: list[str] | None = None) -> Starlette:
    body = manifest.dumps(manifest.build(root, names))

    async def manifest_json(request) -> Response:
        return Response(body, media_type="application/json")

    return Starlette(routes=[Route("/manifest.json", manifest_json, methods=["GET"]),
                             Mount("/files", app=StaticFiles(directory=root))])


async def serve_origin(root: Path, *, host: str = "127.0.0.1", port: int = 0, names: list[str] | None = None,
                       task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Serve `root`'s files (or `names` of them) until cancelled; reports the bound (host, port)."""
    config = Config()
    config.bind = [f"{host}:{port}"]
    config.errorlog = logging.getLogger("hypercorn.error")
    config.accesslog = None
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(partial(serve, build_app(root, names), config, mode="asgi"))
        bound_host, _, bound_port = binds[0].removeprefix("http://").rpartition(":")
        task_status.started((bound_host.strip("[]"), int(bound_port)))


async def warm(port: int, root: Path) -> None:
    """One local request of each kind before any node's: a fresh origin's first Range answer takes ~60 ms of its own
    (StaticFiles' thread pool and first file), which a mirror that has served before does not pay."""
    import httpx2

    first = next((p.name for p in sorted(root.iterdir()) if p.is_file()), None)
    async with httpx2.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
        await client.get("/manifest.json")
        if first is not None:
            await client.get(f"/files/{first}", headers={"Range": "bytes=0-0"})


async def _main(root: Path, host: str, until_eof: bool) -> None:
    async with trio.open_nursery() as nursery:
        _, port = await nursery.start(partial(serve_origin, root, host=host))
        await warm(port, root)
        print(json.dumps({"port": port}), flush=True)
        if until_eof:
            stdin = trio.lowlevel.FdStream(os.dup(sys.stdin.fileno()))
            while await stdin.receive_some():
                pass
            nursery.cancel_scope.cancel()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agents.weights.origin", description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path)
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--until-eof", action="store_true", help="stop when stdin closes (how a launcher stops it)")
    args = parser.parse_args(argv)
    if not args.root.is_dir():
        parser.error(f"{args.root} is not a directory")
    try:
        trio.run(_main, args.root, args.host, args.until_eof)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
