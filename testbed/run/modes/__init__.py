"""Each decode mode's part of the run summary: its totals from the run log's laps."""
