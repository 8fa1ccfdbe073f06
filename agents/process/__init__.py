"""The agent process: one pipeline stage serving frames around the ring (its links, stamps, wire format, batching,
prefill and the head off the entry)."""
