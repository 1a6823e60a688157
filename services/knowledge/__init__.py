"""Retrieval over an agent's documents, local and deterministic (no network)."""
