"""One run: the launcher, time dilation, the run log, the summary and its predictions, the collector, the trace."""
