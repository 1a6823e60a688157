"""The runtime's view of the configuration catalog: the current revision for new runs, any pinned one by number."""

from __future__ import annotations

from contracts.catalog import AgentConfig
from services.registry import Registry


class RunCatalog:
    """Revision 0 is the deployment's built-in catalog (each agent's own `config`)."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry

    async def start(self) -> None:
        return None

    def current(self, agent: str) -> tuple[int, AgentConfig]:
        """The revision a run starting now is pinned to, and its agent's configuration there."""
        return 0, self.registry.agent(agent).config

    async def pinned(self, revision: int, agent: str) -> AgentConfig:
        """The agent's configuration at the revision a run started with, for the rest of that run."""
        return self.registry.agent(agent).config

    async def stop(self) -> None:
        return None
