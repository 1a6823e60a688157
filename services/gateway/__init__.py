"""The gateway: HTTP in, inbound dedup, and read access to run journals."""
