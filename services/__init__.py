"""The crashsafe services: gateway, runtime, tool executors, reconciler, and the sandbox outside world."""
