"""`python -m crashsafe.testing MODULE:FUNCTION [--port 0]`: serve a script as a model, for `crashsafe up --model-url`."""

from __future__ import annotations

from crashsafe.testing.model_server import main

main()
