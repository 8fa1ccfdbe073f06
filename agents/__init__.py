"""Tiny transformer pipeline stages, the agent process, speculation and the wire format."""
