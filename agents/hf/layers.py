"""A checkpoint's decoder layers in plain torch, by family (their tensors' names and shapes: agents.hf.checkpoint).

Why not transformers' own classes: importing any of its model modules (even a config class) brings in its
activations, kernels and masking utilities, and through them torch._dynamo, torch.distributed.tensor and sympy:
~100 MiB of every agent's RSS for code a stage never runs. The two layer shapes of the supported families are a
page each (below), their numerics are checked against transformers' forward and generate in tests/test_hf.py, and
transformers stays what builds the test checkpoints and the reference.

- Llama, Qwen2, Mistral: pre-norm (RMSNorm) attention with rotary positions and grouped KV heads, then a gated
  MLP (down(act(gate(x)) * up(x))); Qwen2 has biases on q, k and v, Llama where `attention_bias` / `mlp_bias`.
  Rotary frequencies: "default", "linear" and "llama3" (Llama 3.1+) scaling; any other is refused by name.
- GPT-2: pre-norm (LayerNorm) attention over a fused c_attn, then an MLP; its Conv1D weights are [in, out].
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from agents.hf.checkpoint import rope_parameters

ACTIVATIONS = {  # agents.hf.checkpoint.ACTIVATION_NAMES: what a checkpoint is checked against when it is opened
    "silu": F.silu, "swish": F.silu, "relu": F.relu, "gelu": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"), "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
}


def activation(checkpoint):
    """The MLP's activation (checked when the checkpoint was opened)."""
    if checkpoint.model_type == "gpt2":
        return ACTIVATIONS[checkpoint.config.get("activation_function", "gelu_new")]
    return ACTIVATIONS[checkpoint.config.get("hidden_act", "silu")]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _linear(x: torch.Tensor, w: dict, name: str) -> torch.Tensor:
    return F.linear(x, w[f"{name}.weight"], w.get(f"{name}.bias"))


class Rotary:
    """Rotary position embedding: the inverse frequencies from config.json (rope_parameters, or the older
    rope_theta + rope_scaling; the scaling checked when the checkpoint was opened), cos/sin computed per call at
    the tokens' own positions."""

    def __init__(self, checkpoint) -> None:
        params = rope_parameters(checkpoint.config)
        kind, theta = params["rope_type"], float(params["rope_theta"])
        dim = checkpoint.shape.head_dim
        inv_freq = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim)  # [hd/2], float32
        if kind == "linear":
            inv_freq = inv_freq / float(params["factor"])
        elif kind == "llama3":
            inv_freq = _llama3_frequencies(inv_freq, params)
        self.inv_freq = inv_freq

    def __call__(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [B, T] -> cos, sin [B, 1, T, hd] (broadcast over the heads)."""
        angles = positions[..., None].to(torch.float32) * self.inv_freq  # [B, T, hd/2]
        angles = torch.cat((angles, angles), dim=-1)[:, None]  # [B, 1, T, hd]
        return angles.cos(), angles.sin()


def _llama3_frequencies(inv_freq: torch.Tensor, params: dict) -> torch.Tensor:
    """Llama 3.1's scaling: wavelengths longer than the original context / low_freq_factor are divided by
    `factor`, shorter than it / high_freq_factor kept, and those between blended linearly in context / wavelength."""
    factor, low, high = float(params["factor"]), float(params["low_freq_factor"]), float(params["high_freq_factor"])
    context = float(params["original_max_position_embeddings"])
    wavelength = 2 * math.pi / inv_freq
    blend = ((context / wavelength - low) / (high - low)).clamp(0.0, 1.0)  # 0: long waves, 1: short ones
    return (1 - blend) * inv_freq / factor + blend * inv_freq


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask, scale: float) -> torch.Tensor:
    """q [B, H, T, hd] over k, v [B, kv_heads, S, hd] (each KV head serves H / kv_heads consecutive query heads)
    -> [B, T, H * hd]."""
    if k.shape[1] != q.shape[1]:
        repeat = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)  # [B, H, T, hd]
    return out.transpose(1, 2).flatten(2)


class LlamaLayer:
    """One Llama / Qwen2 / Mistral decoder layer over its tensors (names relative to the layer)."""

    def __init__(self, checkpoint, index: int, tensors: dict) -> None:
        self.index, self.w, self.shape = index, tensors, checkpoint.shape
        self.eps = float(checkpoint.config.get("rms_norm_eps", 1e-6))
        self.act = activation(checkpoint)

    def __call__(self, x: torch.Tensor, mask, cache, rope) -> torch.Tensor:
        w, (B, T, _), hd = self.w, x.shape, self.shape.head_dim
        h = rms_norm(x, w["input_layernorm.weight"], self.eps)
        q = _linear(h, w, "self_attn.q_proj").view(B, T, -1, hd).transpose(1, 2)  # [B, H, T, hd]
        k = _linear(h, w, "self_attn.k_proj").view(B, T, -1, hd).transpose(1, 2)  # [B, kv_heads, T, hd]
        v = _linear(h, w, "self_attn.v_proj").view(B, T, -1, hd).transpose(1, 2)
        cos, sin = rope
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        if cache is not None:
            k, v = cache.update(k, v, self.index)
        x = x + _linear(_attend(q, k, v, mask, hd ** -0.5), w, "self_attn.o_proj")
        h = rms_norm(x, w["post_attention_layernorm.weight"], self.eps)
        return x + _linear(self.act(_linear(h, w, "mlp.gate_proj")) * _linear(h, w, "mlp.up_proj"), w, "mlp.down_proj")


class GPT2Layer:
    """One GPT-2 block over its tensors (Conv1D weights are [in, out])."""

    def __init__(self, checkpoint, index: int, tensors: dict) -> None:
        self.index, self.w, self.shape, config = index, tensors, checkpoint.shape, checkpoint.config
        self.eps = float(config.get("layer_norm_epsilon", 1e-5))
        self.act = activation(checkpoint)
        self.scale = (self.shape.head_dim ** -0.5 if config.get("scale_attn_weights", True) else 1.0) / (
            index + 1 if config.get("scale_attn_by_inverse_layer_idx") else 1)

    def _conv(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return torch.addmm(self.w[f"{name}.bias"], x.flatten(0, -2), self.w[f"{name}.weight"]).view(
            *x.shape[:-1], -1)

    def __call__(self, x: torch.Tensor, mask, cache, rope) -> torch.Tensor:
        w, (B, T, C), hd = self.w, x.shape, self.shape.head_dim
        h = F.layer_norm(x, (C,), w["ln_1.weight"], w["ln_1.bias"], self.eps)
        q, k, v = (part.view(B, T, -1, hd).transpose(1, 2) for part in self._conv(h, "attn.c_attn").split(C, dim=2))
        if cache is not None:
            k, v = cache.update(k, v, self.index)
        x = x + self._conv(_attend(q, k, v, mask, self.scale), "attn.c_proj")
        h = F.layer_norm(x, (C,), w["ln_2.weight"], w["ln_2.bias"], self.eps)
        return x + self._conv(self.act(self._conv(h, "mlp.c_fc")), "mlp.c_proj")


def build_layer(checkpoint, index: int, tensors: dict):
    """Layer `index` over its tensors (canonical names, the layer's prefix stripped)."""
    return (GPT2Layer if checkpoint.model_type == "gpt2" else LlamaLayer)(checkpoint, index, tensors)
