"""The runtime: runs the agent loop, one actor per run, its state a fold of its own journal."""
