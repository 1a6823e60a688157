"""Operator tooling: the `crashsafe` command, the demo, the stack supervisor and the timeline renderer (not a service)."""
