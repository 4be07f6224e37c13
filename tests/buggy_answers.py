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
            "def additive_scores(q_proj, k_proj, v):\n"
            "    return (q_proj[:, None, :] + k_proj) @ v\n"
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
        # 0 * log 0 = NaN
        "attention_entropy": (
            "def attention_entropy(weights):\n"
            "    return -(weights * torch.log(weights)).sum(dim=-1)\n"
        ),
        # scaled by the model width H * Dh
        "scaled_scores": (
            "def scaled_scores(q, k):\n"
            "    return q @ k.transpose(-2, -1) / (q.shape[1] * q.shape[-1]) ** 0.5\n"
        ),
    },
}
