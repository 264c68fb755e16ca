"""Cost accounting from a price table (`configs/prices.yaml`): USD per million tokens.

A model that is not in the table has an unknown cost: `cost_usd` is None, never 0 and never
an error. Local models are listed with price 0 explicitly when that is what is meant.
"""
from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from msa_eval.errors import MsaEvalError

DEFAULT_PRICES = Path(__file__).resolve().parents[2] / "configs" / "prices.yaml"


class ModelPrice(BaseModel):
    model_config = ConfigDict(extra="forbid")
    input_per_mtok: float = Field(ge=0)
    output_per_mtok: float = Field(ge=0)


class PriceFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    models: dict[str, ModelPrice] = Field(default_factory=dict)


class PriceTable:
    def __init__(self, prices: dict[str, ModelPrice] | None = None) -> None:
        self.prices = dict(prices or {})

    @classmethod
    def load(cls, path: str | Path | None = None) -> PriceTable:
        """Read a price file; a missing default file gives an empty table (all costs unknown)."""
        p = Path(path) if path else DEFAULT_PRICES
        if not p.exists():
            if path:
                raise MsaEvalError(f"price table {p} does not exist; pass an existing YAML file or leave it unset")
            return cls()
        try:
            data = PriceFile.model_validate(yaml.safe_load(p.read_text()) or {})
        except (ValidationError, yaml.YAMLError) as e:
            first = str(e).splitlines()[0:3]
            raise MsaEvalError(f"bad price table {p}: {' '.join(first)}; "
                               "expected models: {id: {input_per_mtok, output_per_mtok}}") from e
        return cls(data.models)

    def cost(self, model: str, prompt_tokens: int | None, completion_tokens: int | None) -> float | None:
        """USD for one call, or None when the price or a token count is unknown."""
        price = self.prices.get(model)
        if price is None or prompt_tokens is None or completion_tokens is None:
            return None
        return (prompt_tokens * price.input_per_mtok + completion_tokens * price.output_per_mtok) / 1e6
