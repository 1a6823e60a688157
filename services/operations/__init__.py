"""Operator tasks (list, replay, retry, audit, reconcile): one home the CLI and the console both call."""
