"""The run's records: rows, transcripts, the metric logger, progress, the summary, the sweep ledger."""
