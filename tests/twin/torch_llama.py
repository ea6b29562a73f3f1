"""nibble's Llama-style model written independently in PyTorch: the twin that
tests/twin/test_torch_twin.py checks nibble's loss and gradients against, and the model that
bench/torch_train.py times PyTorch training on.

It is written from the equations in src/model/transformer.h and the layer headers, with autograd
in place of hand-written backward passes, and follows nibble's conventions where a Llama
implementation could choose differently:
  - RMSNorm y = x / sqrt(mean(x^2) + eps) * gain, eps 1e-5;
  - one fused QKV linear whose output holds, per token, all query heads, then all key heads, then
    all value heads; query head h reads key/value head h // (heads // kv_heads) (GQA);
  - RoPE in the half-split convention (element i pairs with i + head_dim/2, angle
    pos * theta^(-2i/head_dim), theta 10000), position = index within the sequence;
  - one fused gate/up linear, gate first: a = silu(gate) * up;
  - no biases; logits = final_norm(x) @ E^T when tied, lm_head otherwise; mean cross-entropy.
Linear weights are [out, in] as in nibble (and torch.nn.Linear).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

NORM_EPS = 1e-5
ROPE_THETA = 10000.0


@dataclass
class LlamaConfig:
    vocab: int = 65
    layers: int = 6
    heads: int = 6
    kv_heads: int = 0  # 0: same as heads
    width: int = 384
    mlp_hidden: int = 0  # 0: 8/3 width rounded up to a multiple of 32, as nibble picks it
    context: int = 256
    tied_embeddings: bool = True
    norm_eps: float = NORM_EPS
    rope_theta: float = ROPE_THETA

    @property
    def kv_head_count(self) -> int:
        return self.kv_heads or self.heads

    @property
    def head_dim(self) -> int:
        return self.width // self.heads

    @property
    def hidden(self) -> int:
        return self.mlp_hidden or (8 * self.width // 3 + 31) // 32 * 32


class RMSNorm(nn.Module):
    def __init__(self, width: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_tables(context: int, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [context, head_dim/2] in float64."""
    inv_freq = theta ** (-2.0 * torch.arange(head_dim // 2, dtype=torch.float64) / head_dim)
    angle = torch.arange(context, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return angle.cos(), angle.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [batch, heads, seq, head_dim]; cos, sin: [seq, head_dim/2]."""
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    return torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)


class Block(nn.Module):
    def __init__(self, c: LlamaConfig, fused_attention: bool):
        super().__init__()
        self.c = c
        self.fused_attention = fused_attention
        hd = c.head_dim
        self.norm1 = RMSNorm(c.width, c.norm_eps)
        self.qkv = nn.Linear(c.width, (c.heads + 2 * c.kv_head_count) * hd, bias=False)
        self.attn_out = nn.Linear(c.heads * hd, c.width, bias=False)
        self.norm2 = RMSNorm(c.width, c.norm_eps)
        self.gate_up = nn.Linear(c.width, 2 * c.hidden, bias=False)
        self.down = nn.Linear(c.hidden, c.width, bias=False)

    def attention(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        c = self.c
        B, S, _ = h.shape
        H, Hkv, hd = c.heads, c.kv_head_count, c.head_dim
        q, k, v = self.qkv(h).split([H * hd, Hkv * hd, Hkv * hd], dim=-1)
        q = q.view(B, S, H, hd).transpose(1, 2)
        k = k.view(B, S, Hkv, hd).transpose(1, 2)
        v = v.view(B, S, Hkv, hd).transpose(1, 2)
        # Under bf16 autocast q and k are bf16 and the tables float32: keep the activations' dtype.
        q, k = apply_rope(q, cos, sin).to(q.dtype), apply_rope(k, cos, sin).to(k.dtype)
        # Query heads g*group .. (g+1)*group-1 share kv head g: repeat each kv head group times.
        k = k.repeat_interleave(H // Hkv, dim=1)
        v = v.repeat_interleave(H // Hkv, dim=1)
        if self.fused_attention:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
            causal = torch.ones(S, S, dtype=torch.bool, device=h.device).triu(1)
            o = scores.masked_fill(causal, float("-inf")).softmax(dim=-1) @ v
        return o.transpose(1, 2).reshape(B, S, H * hd)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn_out(self.attention(self.norm1(x), cos, sin))
        gate, up = self.gate_up(self.norm2(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


class Llama(nn.Module):
    """fused_attention: torch's scaled_dot_product_attention (PyTorch >= 2.0) instead of the
    explicit softmax(QK^T/sqrt(d) + causal mask) V; the twin test keeps the explicit form."""

    def __init__(self, c: LlamaConfig, fused_attention: bool = False):
        super().__init__()
        if fused_attention and not hasattr(F, "scaled_dot_product_attention"):
            raise ValueError(f"torch {torch.__version__} has no scaled_dot_product_attention (needs >= 2.0)")
        self.c = c
        self.embedding = nn.Parameter(torch.empty(c.vocab, c.width))
        self.blocks = nn.ModuleList(Block(c, fused_attention) for _ in range(c.layers))
        self.final_norm = RMSNorm(c.width, c.norm_eps)
        self.lm_head = None if c.tied_embeddings else nn.Parameter(torch.empty(c.vocab, c.width))
        cos, sin = rope_tables(c.context, c.head_dim, c.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.init_weights(std=0.02)

    def init_weights(self, std: float) -> None:
        """nibble's scheme (Transformer::init_weights): N(0, std) for matrices, std/sqrt(2 layers)
        for the projections into the residual stream, ones for norm gains."""
        residual_std = std / math.sqrt(2 * self.c.layers)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if p.dim() == 1:
                    p.fill_(1.0)
                else:
                    residual = name.endswith("attn_out.weight") or name.endswith("down.weight")
                    p.normal_(0.0, residual_std if residual else std)

    def nibble_parameters(self) -> dict[str, torch.Tensor]:
        """The parameters under nibble's names (src/model/transformer.cpp): 'embedding',
        'block{l}.{norm1,qkv,attn_out,norm2,gate_up,down}', 'final_norm', 'lm_head' (untied)."""
        out = {"embedding": self.embedding}
        for l, b in enumerate(self.blocks):
            for part in ("norm1", "qkv", "attn_out", "norm2", "gate_up", "down"):
                out[f"block{l}.{part}"] = getattr(b, part).weight
        out["final_norm"] = self.final_norm.weight
        if self.lm_head is not None:
            out["lm_head"] = self.lm_head
        return out

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """tokens, targets: [batch, seq] int64, seq <= context. Returns the mean cross-entropy."""
        S = tokens.shape[1]
        cos = self.rope_cos[:S].to(self.embedding.dtype)
        sin = self.rope_sin[:S].to(self.embedding.dtype)
        x = self.embedding[tokens]
        for block in self.blocks:
            x = block(x, cos, sin)
        head = self.embedding if self.lm_head is None else self.lm_head
        logits = self.final_norm(x) @ head.t()
        return F.cross_entropy(logits.reshape(-1, self.c.vocab), targets.reshape(-1))
