"""The runtime's pure core: folding a run's events into state and deciding its next move. No I/O here."""
