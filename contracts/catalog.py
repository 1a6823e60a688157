"""The configuration catalog: each agent's tools, policies, budgets, prompt and model routes, versioned in JetStream
KV (`<ns>_catalog`, with history) and pinned per run by its revision (`run.started.catalog_revision`)."""

from __future__ import annotations

from enum import StrEnum

import msgspec

from crashsafe.contracts.policy import Rule
from crashsafe.contracts.run_events import Budget


class ModelApi(StrEnum):
    """Which OpenAI-compatible protocol a route speaks (both through the `openai` client)."""

    RESPONSES = "responses"
    CHAT = "chat_completions"  # vLLM, Ollama, LiteLLM
    # Answered in the runtime's own process from a fixed script, no HTTP and no key: the synthetic turn's route,
    # so a probe on a cadence never pays for a model call (services/runtime/fixed_model.py).
    FIXED = "fixed"


class ModelRoute(msgspec.Struct, frozen=True, kw_only=True):
    """One provider a run's model calls may go to; an agent's routes are tried in order (failover)."""

    name: str
    model: str
    api: str = ModelApi.RESPONSES.value
    # Empty: the deployment's `OPENAI_BASE_URL` (the sandbox's scripted model when unset).
    base_url: str = ""
    # The environment variable holding this route's API key (never the key itself: the catalog is not secret).
    api_key_env: str = "OPENAI_API_KEY"
    timeout_s: float = 30.0


class AgentConfig(msgspec.Struct, frozen=True, kw_only=True):
    """One agent's configuration. `tools` empty: every tool the agent's code offers the model."""

    agent: str
    instructions: str = ""  # empty: the agent's own
    tools: list[str] = []
    rules: list[Rule] = []
    budget: Budget = Budget()
    routes: list[ModelRoute] = []  # empty: the deployment's CRASHSAFE_MODEL on its OPENAI_BASE_URL
    # The same tool call (name and arguments) this many times in one run is a loop: the run is handed off.
    max_repeats: int = 3
    memory: bool = False  # read the guest's profile into run.started and the model's context
    retrieval: bool = False  # search the agent's documents before each turn's first model call


class Catalog(msgspec.Struct, frozen=True, kw_only=True):
    """What `crashsafe config publish` writes: every agent's configuration, validated before it is published."""

    agents: dict[str, AgentConfig]
    label: str = ""


catalog_encoder = msgspec.json.Encoder(order="sorted")
catalog_decoder = msgspec.json.Decoder(Catalog)
