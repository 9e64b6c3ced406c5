"""The built-in model's shape (``--d-model``, ``--n-layers``, ...): a small decoder-only
transformer over bytes, for the demo and the tests (a Hugging Face model is ``--model-path``)."""

from __future__ import annotations

from pydantic import Field, model_validator

from trainer.config.fields import Settings


class ModelConfig(Settings):
    """The built-in decoder-only transformer (byte-level vocabulary)."""

    d_model: int = Field(128, ge=8, description="Built-in model width.")
    n_layers: int = Field(4, ge=1, description="Built-in model depth.")
    n_heads: int = Field(4, ge=1, description="Built-in model attention heads.")
    d_ff: int | None = Field(None, ge=1, description="Built-in MLP width (default: 4 * d_model).")
    max_seq_len: int = Field(
        64, ge=4, description="Built-in model context in tokens (the training max_seq_len sets it)."
    )
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="Built-in model dropout.")

    @model_validator(mode="after")
    def _heads_divide(self) -> ModelConfig:
        if self.d_model % self.n_heads:
            raise ValueError(
                f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})"
            )
        return self
