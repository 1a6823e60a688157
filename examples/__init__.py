"""Examples of reading crashsafe from outside: consumers built on the public contracts only."""
