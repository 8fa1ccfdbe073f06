"""python -m testbed: see testbed.cli."""

import sys

from testbed.cli import main

sys.exit(main())
