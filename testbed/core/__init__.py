"""The ground floor: errors, the clock, physics, typed records and the JSON-lines channel (imports nothing above)."""
