"""Qwen3-Next as the release builds it: Qwen3 blocks whose MLP is a mixture of experts in the
layers the config selects, with an optional gated shared expert.

Block i has a MoE MLP iff ``moe``, i ∉ ``mlp_only_layers`` and i % ``decoder_sparse_step`` == 0
(the release's rule; Hugging Face's is (i + 1) % step). With ``use_gated_shared_expert`` each MoE
layer adds σ(x·w_g)·SE(x): one SwiGLU expert of hidden ``shared_expert_intermediate_size`` (the
MLP hidden by default) scaled by a per-token sigmoid gate (see ``danastar.models.moe``). The
architecture implies ``moe``; without it the model is dense Qwen3. Not built: the release's name
promises Gated DeltaNet attention, zero-centred norms and multi-token prediction, which its
``qwen3next`` does not have either.
"""

from __future__ import annotations

from danastar.models.qwen3 import Qwen3, Qwen3Block


class Qwen3Next(Qwen3):
    make_block = staticmethod(Qwen3Block)
