"""Gradients through a deep stack of blocks: post-LN, pre-LN, no residuals (notebook 07).

A pre-LN stack ends with a final LayerNorm, as in the course's transformer, in
GPT-2 and in Xiong et al. (2020): without it the un-normalised residual stream
reaches the loss directly and the gradients are not comparable with post-LN's.
"""

from __future__ import annotations

import math

import torch

from course_utils.blocks.transformer import TransformerEncoderBlock


def gradient_norms_by_layer(depth: int, norm_first: bool, residual_connections: bool = True, d_model: int = 64,
                            num_heads: int = 4, d_ff: int = 128, B: int = 8, T: int = 16,
                            seed: int = 0, final_norm: bool | None = None) -> list[float]:
    """Gradient norm of each block's parameters at initialisation, for a stack of encoder blocks (notebook 07).

    The loss is the mean squared error against a random target. Without
    residual connections each sublayer's output replaces its input (post-LN:
    ``norm(sublayer(x))``; pre-LN: ``sublayer(norm(x))``).

    Args:
        depth: Number of blocks.
        norm_first: Pre-LN (True) or post-LN (False).
        residual_connections: Keep (True) or remove (False) the residual additions.
        d_model, num_heads, d_ff: Block sizes.
        B, T: Batch size and sequence length of the random input.
        seed: Seed for the weights, input and target.
        final_norm: Apply a LayerNorm to the stack's output before the loss;
            ``None`` (default) means yes for pre-LN stacks, no for post-LN ones,
            whose last block already ends with one.

    Returns:
        ``depth`` gradient norms, from the first block (nearest the input) to the last.
    """
    torch.manual_seed(seed)
    blocks = [TransformerEncoderBlock(d_model, num_heads, d_ff, norm_first=norm_first) for _ in range(depth)]
    final = torch.nn.LayerNorm(d_model) if (norm_first if final_norm is None else final_norm) else torch.nn.Identity()
    x = torch.randn(B, T, d_model)
    target = torch.randn(B, T, d_model)
    h = x
    for block in blocks:
        if residual_connections:
            h = block(h)
        elif norm_first:
            h = block.self_attn(block.norm1(h))
            h = block.feed_forward(block.norm2(h))
        else:
            h = block.norm1(block.self_attn(h))
            h = block.norm2(block.feed_forward(h))
    loss = ((final(h) - target) ** 2).mean()
    loss.backward()
    return [math.sqrt(sum(float((p.grad ** 2).sum()) for p in block.parameters() if p.grad is not None))
            for block in blocks]
