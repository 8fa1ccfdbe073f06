"""python -m agents.forkserver: the fork server process (started by the launcher, agents.forkserver.client)."""

import sys

from agents.forkserver.server import main

sys.exit(main())
