"""Process infrastructure every service shares, and nothing else: the JetStream adapter, the one delivery loop,
settings, logs, tracing, telemetry, metrics, probes, crash points and the NATS users' credentials."""
