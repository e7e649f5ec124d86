"""danastar.models: the Enoki, Qwen3, Llama and Qwen3-Next language models, dense or with
mixture-of-experts MLPs.

    from danastar.models import ModelConfig, build_model
    model = build_model(ModelConfig.from_heads("enoki", 6, vocab_size=50257, max_seq_len=1024))
    loss, ce, z, moe = model(idx, targets)
"""

from __future__ import annotations

import dataclasses
from typing import Any

from torch import nn

from danastar.models.config import (
    ARCHITECTURES,
    ModelConfig,
    MoEConfig,
    ParamCounts,
    param_counts,
)
from danastar.models.enoki import Enoki
from danastar.models.llama import Llama
from danastar.models.loss import LossOutput, chunked_cross_entropy
from danastar.models.qwen3 import Qwen3
from danastar.models.qwen3next import Qwen3Next
from danastar.models.transformer import Transformer

MODELS: dict[str, type[Transformer]] = {"enoki": Enoki, "qwen3": Qwen3, "llama": Llama,
                                        "qwen3next": Qwen3Next}
assert tuple(MODELS) == ARCHITECTURES, "each architecture has its ladder and its class"


def build_model(arch_or_config: str | ModelConfig, **kwargs: Any) -> nn.Module:
    """The model for a ``ModelConfig`` (``kwargs`` replace its fields) or for an arch name
    (``kwargs`` are the ``ModelConfig`` fields, flat or nested as ``from_dict`` reads them)."""
    if isinstance(arch_or_config, ModelConfig):
        config = dataclasses.replace(arch_or_config, **kwargs)
    elif arch_or_config in MODELS:
        config = ModelConfig.from_dict({"arch": arch_or_config, **kwargs})
    else:
        raise ValueError(f"unknown arch {arch_or_config!r}; valid choices: {', '.join(MODELS)}")
    return MODELS[config.arch](config)


__all__ = ["ARCHITECTURES", "MODELS", "Enoki", "Llama", "LossOutput", "ModelConfig", "MoEConfig",
           "ParamCounts", "Qwen3", "Qwen3Next", "Transformer", "build_model",
           "chunked_cross_entropy", "param_counts"]
