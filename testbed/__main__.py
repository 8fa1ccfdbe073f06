"""python -m testbed: see testbed.cli."""

import faulthandler
import signal
import sys

from testbed.cli import main

faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1` prints where every thread is (a hung run)
sys.exit(main())
