"""Known-buggy answers to every graded exercise, keyed by notebook and solution cell.

The grading round-trip (tests/test_grading.py) puts each one into an otherwise
correct submission and requires that exactly that exercise loses its points;
tests/test_checks.py requires the checkers to reject them with a message that
names the bug. Every solution cell of every notebook must have an entry here.
"""

BUGGY = {
    "00_orientation": {
        # True marks padding instead of real tokens
        "padding_mask": (
            "def padding_mask(lengths, S):\n"
            "    return (torch.arange(S)[None, :] >= lengths[:, None])[:, None, :]\n"
        ),
        # keys times queries: (B, S, T)
        "pairwise_scores": (
            "def pairwise_scores(q, k):\n"
            "    return k @ q.transpose(-2, -1)\n"
        ),
        # softmax over the queries
        "masked_softmax": (
            "def masked_softmax(scores, mask=None):\n"
            "    return torch.softmax(scores.masked_fill(~mask, float('-inf')), dim=-2).nan_to_num(0.0)\n"
        ),
    },
    "01_seq2seq_bottleneck": {
        # the last column: padding for shorter sequences
        "final_states": (
            "def final_states(states, lengths):\n"
            "    return states[:, -1]\n"
        ),
        # compares padding positions too
        "sequence_exact_match": (
            "def sequence_exact_match(tokens, targets, pad_id=0):\n"
            "    return (tokens == targets).all(dim=1)\n"
        ),
    },
    "02_bahdanau_attention": {
        # tanh missing
        "additive_scores": (
            "def additive_scores(q_proj, k_proj, v_a):\n"
            "    return (q_proj[:, None, :] + k_proj) @ v_a\n"
        ),
        # padding not masked
        "attend": (
            "def attend(scores, values, mask=None):\n"
            "    weights = torch.softmax(scores, dim=-1)\n"
            "    return (weights[:, :, None] * values).sum(1), weights\n"
        ),
        # W transposed
        "bilinear_scores": (
            "def bilinear_scores(query, keys, W):\n"
            "    return (keys @ (query @ W.T)[:, :, None])[:, :, 0]\n"
        ),
    },
    "03_self_attention": {
        # the scores are not scaled by 1/sqrt(Dk)
        "scaled_dot_product_attention": (
            "def scaled_dot_product_attention(q, k, v, mask=None, scale=None):\n"
            "    scores = q @ k.transpose(-2, -1)\n"
            "    if mask is not None:\n"
            "        scores = scores.masked_fill(~mask, float('-inf'))\n"
            "    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)\n"
            "    return weights @ v, weights\n"
        ),
        # misses statement 6 (v_i instead of v_j)
        "spot_the_error": "spot_the_error = {1, 4, 5}\n",
    },
    "04_scaling": {
        # right values, but a NaN gradient at the masked keys: torch.where still takes log 0 in the backward pass
        # (the forward NaN, -(w * log w).sum(-1), is in tests/test_checks.py)
        "attention_entropy": (
            "def attention_entropy(weights):\n"
            "    terms = torch.where(weights > 0, weights * torch.log(weights), torch.zeros_like(weights))\n"
            "    return -terms.sum(dim=-1)\n"
        ),
        # scaled by the model width H * Dh
        "scaled_scores": (
            "def scaled_scores(q, k):\n"
            "    return q @ k.transpose(-2, -1) / (q.shape[1] * q.shape[-1]) ** 0.5\n"
        ),
    },
    "05_multi_head_attention": {
        # a view straight to the head shape: scrambles tokens across heads
        "split_heads": (
            "def split_heads(x, num_heads):\n"
            "    B, T, D = x.shape\n"
            "    return x.view(B, num_heads, T, D // num_heads)\n"
        ),
        # reshape without transposing back
        "merge_heads": (
            "def merge_heads(x):\n"
            "    B, H, T, Dh = x.shape\n"
            "    return x.reshape(B, T, H * Dh)\n"
        ),
        # the output projection is missing
        "multi_head_attention": (
            "def multi_head_attention(query, key, value, q_proj, k_proj, v_proj, out_proj, num_heads, mask=None):\n"
            "    from course_utils.blocks.attention import scaled_dot_product_attention\n"
            "    from course_utils.blocks.multihead import merge_heads, split_heads\n"
            "    q, k, v = (split_heads(p(t), num_heads) for p, t in ((q_proj, query), (k_proj, key), (v_proj, value)))\n"
            "    context, weights = scaled_dot_product_attention(q, k, v, mask)\n"
            "    return merge_heads(context), weights\n"
        ),
    },
    "06_positional_encoding": {
        # sine and cosine swapped
        "sinusoidal_positional_encoding": (
            "def sinusoidal_positional_encoding(T, D):\n"
            "    angles = torch.arange(T)[:, None] * 10000 ** (-torch.arange(0, D, 2)[None, :] / D)\n"
            "    pe = torch.zeros(T, D)\n"
            "    pe[:, 0::2], pe[:, 1::2] = torch.cos(angles), torch.sin(angles)\n"
            "    return pe\n"
        ),
        # rotates by minus the angle
        "apply_rotary": (
            "def apply_rotary(x, positions=None):\n"
            "    from course_utils.blocks.positional import apply_rotary as reference\n"
            "    T = x.shape[-2]\n"
            "    positions = torch.arange(T) if positions is None else positions\n"
            "    return reference(x, -positions)\n"
        ),
    },
    "07_transformer_block": {
        # the unbiased variance (divides by D - 1)
        "layer_norm": (
            "def layer_norm(x, weight, bias, eps=1e-5):\n"
            "    mean = x.mean(dim=-1, keepdim=True)\n"
            "    return (x - mean) / torch.sqrt(x.var(dim=-1, keepdim=True) + eps) * weight + bias\n"
        ),
        # judges by the output's statistics: a post-LN block whose LayerNorm has another gain and shift looks pre-LN
        "is_pre_ln": (
            "def is_pre_ln(block, D):\n"
            "    out = block(torch.randn(2, 5, D))\n"
            "    return bool(out.mean(-1).abs().max() > 1e-3)\n"
        ),
    },
    "08_attention_at_scale": {
        # the running sum of values is not rescaled when the maximum grows
        "online_softmax_update": (
            "def online_softmax_update(m, l, acc, scores, v):\n"
            "    m_new = torch.maximum(m, scores.amax(dim=-1, keepdim=True))\n"
            "    p = torch.exp(scores - m_new)\n"
            "    return m_new, l * torch.exp(m - m_new) + p.sum(dim=-1, keepdim=True), acc + p @ v\n"
        ),
    },
    "09_small_gpt": {
        # no shift: each position is scored against the token it reads
        "next_token_loss": (
            "def next_token_loss(model, tokens):\n"
            "    logits = model(tokens[:, :-1])\n"
            "    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, :-1].reshape(-1))\n"
        ),
        # top-p drops the boundary token (and, for a small p, every token)
        "filter_logits": (
            "def filter_logits(logits, top_k=None, top_p=None):\n"
            "    if top_k is not None:\n"
            "        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]\n"
            "        logits = logits.masked_fill(logits < kth, float('-inf'))\n"
            "    if top_p is not None:\n"
            "        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)\n"
            "        drop = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1) > top_p\n"
            "        logits = logits.masked_fill(drop.scatter(-1, order, drop), float('-inf'))\n"
            "    return logits\n"
        ),
        # the causal mask is not shifted by the cached positions
        "attend_with_cache": (
            "def attend_with_cache(q, k, v, cache=None):\n"
            "    if cache is not None:\n"
            "        k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)\n"
            "    mask = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool).tril()\n"
            "    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)\n"
            "    return out, (k, v)\n"
        ),
    },
}
