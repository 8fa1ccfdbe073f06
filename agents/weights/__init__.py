"""A node's weights over the network: an origin serves a checkpoint's files over HTTP, a node fetches the files its
stage needs with parallel range requests, checks every chunk's SHA-256 against the origin's manifest, and resumes a
killed transfer from the chunks it already verified (as exo's downloader: parallel Range requests, resume, a hash
per file; here a hash per chunk, so a corrupted chunk is fetched again on its own).

- `manifest`: the files, their sizes and their chunks' SHA-256, and the strict parse of one that came off a socket;
- `origin`: the HTTP origin (Starlette's FileResponse, which answers Range requests, in hypercorn's Trio worker);
- `fetch`: the client (httpx2 on Trio): a file's missing chunks in P parallel range requests, verified, resumable;
- `verified`: what a node verified, and the check an agent makes before it loads it (no unverified byte is served);
- `stages` and `shards`: a model's tensors by stage, the cut an origin serves, and a stage's model from its shard.
"""
