"""What a model call cost in USD, from a small table of list prices.

The table is approximate and dated (list prices per million tokens, mid-2025, without batch or cache
discounts: Anthropic's cache reads are counted at the full input price, so a heavily cached session costs
less than shown). A model is matched by the longest table prefix of its name, after any `vendor/` prefix
(OpenRouter's `openai/gpt-4o-mini`); an unknown or local model costs 0.0.
"""

from __future__ import annotations

from services.runner.llm import Usage

PRICES_AS_OF = "2025-08"

# model-name prefix -> (USD per million input tokens, USD per million output tokens)
PRICES: dict[str, tuple[float, float]] = {
    "gpt-4o-mini": (0.15, 0.60),
    "gpt-4o": (2.50, 10.00),
    "gpt-4.1-nano": (0.10, 0.40),
    "gpt-4.1-mini": (0.40, 1.60),
    "gpt-4.1": (2.00, 8.00),
    "gpt-5-nano": (0.05, 0.40),
    "gpt-5-mini": (0.25, 2.00),
    "gpt-5": (1.25, 10.00),
    "o3-mini": (1.10, 4.40),
    "o3": (2.00, 8.00),
    "o4-mini": (1.10, 4.40),
    "claude-3-haiku": (0.25, 1.25),
    "claude-3-5-haiku": (0.80, 4.00),
    "claude-haiku-4": (1.00, 5.00),
    "claude-3-5-sonnet": (3.00, 15.00),
    "claude-3-7-sonnet": (3.00, 15.00),
    "claude-sonnet-4": (3.00, 15.00),
    "claude-opus-4": (15.00, 75.00),
    "claude-opus-4-5": (5.00, 25.00),
}


def price_for(model: str) -> tuple[float, float] | None:
    """(input, output) USD per million tokens for model, or None when the table does not know it."""
    name = model.strip().lower().rpartition("/")[2]
    best = max((p for p in PRICES if name.startswith(p)), key=len, default=None)
    return PRICES[best] if best is not None else None


def cost_usd(model: str, usage: Usage) -> float:
    """The approximate cost of one call; 0.0 for unknown and local models."""
    price = price_for(model)
    if price is None:
        return 0.0
    per_in, per_out = price
    return (usage.input_tokens * per_in + usage.output_tokens * per_out) / 1_000_000
