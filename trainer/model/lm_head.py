"""The output layer and the loss in one module, so no full-vocabulary fp32 logits are kept.

:class:`LossHead` replaces a causal LM's output ``nn.Linear``. It holds the same ``weight``
(and ``bias``) parameters under the same names, so checkpoints, the consolidated export and
tied embeddings are unchanged. ``forward(hidden, targets)`` returns the summed next-token
loss through :func:`trainer.model.fused_loss.linear_cross_entropy` (chunked or Liger's fused
kernel); ``forward(hidden)`` returns logits, as the Linear did.

The loss is computed inside the head's own forward on purpose: under FSDP2 the head's
weight is gathered only while a module of its unit runs.

HF models get a training forward, ``forward(input_ids, targets, position_ids, **attention)
-> loss sum``, by :func:`with_loss_forward`, which puts a small class in front of the
model's own (as ``fully_shard`` does): the parameter names stay those of the HF model.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from trainer.model.fused_loss import linear_cross_entropy


class LossHead(nn.Module):
    """Output projection that also computes the summed cross-entropy of its logits."""

    def __init__(
        self,
        linear: nn.Linear,
        impl: str = "plain",
        logit_scale: float = 1.0,
        softcap: float | None = None,
    ) -> None:
        super().__init__()
        self.weight = linear.weight
        self.bias = linear.bias
        # Gemma-style softcapping is applied to whole logits: only the plain path has them.
        self.impl = "plain" if softcap else impl
        self.logit_scale, self.softcap = logit_scale, softcap

    def forward(self, hidden: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        if targets is None:
            return self.logits(hidden)
        if self.softcap:
            logits = self.logits(hidden).float()
            return nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="sum"
            )
        return linear_cross_entropy(
            hidden,
            self.weight,
            targets,
            bias=self.bias,
            logit_scale=self.logit_scale,
            impl=self.impl,
        )

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        out = nn.functional.linear(hidden, self.weight, self.bias) * self.logit_scale
        if self.softcap:
            out = torch.tanh(out / self.softcap) * self.softcap
        return out

    def extra_repr(self) -> str:
        return f"vocab={self.weight.shape[0]}, impl={self.impl}, logit_scale={self.logit_scale}"


def hf_logit_transform(config: Any) -> tuple[float, float | None]:
    """(scale, softcap) an HF architecture applies to its logits: Granite divides by
    ``logits_scaling``, Cohere multiplies by ``logit_scale``, Gemma 2/3 softcap."""
    scale = 1.0
    if getattr(config, "logits_scaling", None):
        scale /= float(config.logits_scaling)
    if getattr(config, "logit_scale", None):
        scale *= float(config.logit_scale)
    softcap = getattr(config, "final_logit_softcapping", None)
    return scale, float(softcap) if softcap else None


class _HFLossForward:
    """Training forward of an HF causal LM: the decoder, then the loss head."""

    def forward(
        self,
        input_ids: torch.Tensor,
        targets: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        **attention: Any,
    ) -> torch.Tensor:
        model: Any = self
        decoder = getattr(model, model.base_model_prefix)
        hidden = decoder(
            input_ids=input_ids, position_ids=position_ids, use_cache=False, **attention
        ).last_hidden_state
        head: LossHead = model.get_output_embeddings()
        return head(hidden, targets)


def with_loss_forward(model: nn.Module, impl: str) -> nn.Module:
    """Give an HF causal LM the training forward and a :class:`LossHead` (in place)."""
    head = model.get_output_embeddings()  # type: ignore[operator]
    if not isinstance(head, nn.Linear):
        raise RuntimeError(f"{type(model).__name__}: the output layer is not a Linear")
    scale, softcap = hf_logit_transform(model.config)
    model.set_output_embeddings(LossHead(head, impl, scale, softcap))  # type: ignore[operator]
    cls = type(model)
    model.__class__ = type(f"{cls.__name__}WithLoss", (_HFLossForward, cls), {})
    return model
