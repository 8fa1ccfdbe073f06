"""`python -m netem.uml [--timeout S] [--mem SIZE] [--verbose] -- COMMAND...`: exits with COMMAND's status."""

import sys

from netem.uml.runner import main

sys.exit(main())
