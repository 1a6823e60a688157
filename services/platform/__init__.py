"""Adapters every service shares: NATS JetStream, the run journal, tracing, logging, settings, crash points."""
