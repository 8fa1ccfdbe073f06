"""python -m agents.forkserver: the fork server process (started by the launcher, agents.forkserver.client)."""

import os
import sys

from agents.forkserver.server import main

code = main()
# Its agents are reaped and nothing of it needs cleaning up: exit without finalizing an interpreter that holds torch
# (measured: ~0.4 s after the launcher's EOF, the whole grace before the launcher's SIGTERM, at the end of every run).
sys.stdout.flush()
sys.stderr.flush()
os._exit(code)
