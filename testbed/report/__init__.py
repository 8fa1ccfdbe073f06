"""`testbed report`: the report of measured vs predicted (build), its runs section (runs) and run figures (figures)."""
