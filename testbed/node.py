"""`torchrun ... -m testbed.node`: one host of a several-host run (the command; testbed.hosts.node does the work)."""

import sys

from testbed.hosts.node import main

if __name__ == "__main__":
    sys.exit(main())
