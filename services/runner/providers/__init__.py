"""Model providers: one class per wire protocol (OpenAI-compatible, Anthropic), built by make_provider from config."""

from services.runner.providers.base import Provider, make_provider
from services.runner.providers.pricing import cost_usd

__all__ = ["Provider", "make_provider", "cost_usd"]
