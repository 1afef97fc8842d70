"""What an LLM call costs: a price table per model, for ``crossaudit_llm_cost_usd_total``.

Prices are USD per million tokens, prompt (input) and completion (output) apart. The built-in
table holds the providers' public list prices for a few common models as they stood when it was
written; contracts, discounts and new models differ, so the operator's table (``llm_prices`` in
the configuration, docs/configuration.md) adds to and overrides it. A model found in neither
still has its tokens counted, with no cost.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated

from pydantic import Field

from crossaudit.kernel.limits import SETTINGS_SECTION, NonNegativeFloat

MILLION = 1_000_000


@dataclass(frozen=True)
class LLMPrice:
    """One model's price, USD per million tokens (``llm_prices``)."""

    __pydantic_config__ = SETTINGS_SECTION

    prompt: Annotated[NonNegativeFloat, Field(description="USD per million prompt (input) tokens")]
    completion: Annotated[NonNegativeFloat, Field(description="USD per million completion (output) tokens")]


DEFAULT_LLM_PRICES: Mapping[str, LLMPrice] = {
    # OpenAI
    "gpt-4o": LLMPrice(2.50, 10.00),
    "gpt-4o-mini": LLMPrice(0.15, 0.60),
    "gpt-4.1": LLMPrice(2.00, 8.00),
    "gpt-4.1-mini": LLMPrice(0.40, 1.60),
    "gpt-4.1-nano": LLMPrice(0.10, 0.40),
    # Anthropic
    "claude-3-5-haiku": LLMPrice(0.80, 4.00),
    "claude-3-5-sonnet": LLMPrice(3.00, 15.00),
    "claude-3-haiku": LLMPrice(0.25, 1.25),
    "claude-sonnet-4": LLMPrice(3.00, 15.00),
    # Google
    "gemini-1.5-flash": LLMPrice(0.075, 0.30),
    "gemini-1.5-pro": LLMPrice(1.25, 5.00),
    "gemini-2.0-flash": LLMPrice(0.10, 0.40),
}

# A dated or moving snapshot name ("gpt-4o-mini-2024-07-18", "claude-3-5-haiku-20241022",
# "claude-3-5-haiku-latest") is priced as its model when the table has no entry of its own.
_SNAPSHOT = re.compile(r"-(?:\d{4}-\d{2}-\d{2}|\d{8}|latest)$")


def price_for(prices: Mapping[str, LLMPrice], model: str) -> LLMPrice | None:
    """The entry for ``model``: its own, else its snapshot's base name's; None = unknown."""
    found = prices.get(model)
    if found is None:
        base = _SNAPSHOT.sub("", model)
        found = prices.get(base) if base != model else None
    return found


def cost_usd(price: LLMPrice, prompt_tokens: int, completion_tokens: int) -> float:
    return (prompt_tokens * price.prompt + completion_tokens * price.completion) / MILLION


# Replay's cost estimate of calling LLM judges again (``policy replay --rerun-llm``) counts tokens
# before any call, from the text alone: its length over CHARS_PER_TOKEN (a rough average of
# English text for the providers' tokenizers), plus PROMPT_OVERHEAD_TOKENS of framing per call
# (roles, the JSON instruction); completions at each judge's max_tokens, so the cost is an upper
# bound rather than a guess that could come in low.
CHARS_PER_TOKEN = 4
PROMPT_OVERHEAD_TOKENS = 64


def estimated_prompt_tokens(*texts: str) -> int:
    return PROMPT_OVERHEAD_TOKENS + -(-sum(len(t) for t in texts) // CHARS_PER_TOKEN)
