"""The network shaping layer: kernel netem (pyroute2) and the userspace relay."""
