"""Decode modes run by the entry agent, one module each; testbed.core.decode.MODES registers them."""
