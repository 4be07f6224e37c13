"""Known-buggy answers to every graded exercise, keyed by notebook and solution cell.

The grading round-trip (tests/test_grading.py) puts each one into an otherwise
correct submission and requires that exactly that exercise loses its points;
tests/test_checks.py requires the checkers to reject them with a message that
names the bug. Every solution cell of every notebook must have an entry here.
"""

# A right answer to notebook 01's exercise 3 (beam search), written as a learner might; the buggy answers below
# change one thing in it.
_BEAM = ("def beam_search(model, src, src_lengths, beam_size, max_len, sos_id=1, eos_id=2):\n"
         "    answers, best = [], []\n"
         "    with torch.no_grad():\n"
         "        _, contexts = model.encoder(src, src_lengths)\n"
         "        for context in contexts.split(1):\n"
         "            state = model.decoder.initial_state(context)\n"
         "            y, prefixes, scores = torch.tensor([sos_id]), torch.zeros(1, 0, dtype=torch.long), torch.zeros(1)\n"
         "            finished = []\n"
         "            for _ in range(max_len):\n"
         "                logits, state = model.decoder.step(y, state, context.expand(len(y), -1))\n"
         "                candidates = (scores[:, None] + logits.log_softmax(dim=-1)).flatten()\n"
         "                kept = candidates.argsort(descending=True)[: beam_size - len(finished)]\n"
         "                parent, y = kept // logits.shape[1], kept % logits.shape[1]\n"
         "                prefixes = torch.cat([prefixes[parent], y[:, None]], dim=1)\n"
         "                scores, state = candidates[kept], state[parent]\n"
         "                ended = y == eos_id\n"
         "                finished += list(zip(scores[ended], prefixes[ended]))\n"
         "                y, prefixes, scores, state = y[~ended], prefixes[~ended], scores[~ended], state[~ended]\n"
         "                if len(y) == 0:\n"
         "                    break\n"
         "            finished += list(zip(scores, prefixes))\n"
         "            score, tokens = max(finished, key=lambda hypothesis: hypothesis[0].item())\n"
         "            best.append(score)\n"
         "            answers.append(tokens)\n"
         "    return torch.nn.utils.rnn.pad_sequence(answers, batch_first=True), torch.stack(best)\n")

BUGGY = {
    "00_orientation": {
        # the (B, 1, S) mask of three-axis scores, whatever the scores: wrong with heads
        "padding_mask_for": (
            "def padding_mask_for(lengths, scores):\n"
            "    return (torch.arange(scores.shape[-1])[None, :] < lengths[:, None])[:, None, :]\n"
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
        # the search stops as soon as one hypothesis has written <eos>
        "beam_search": _BEAM.replace("if len(y) == 0:", "if len(y) == 0 or finished:"),
    },
    "02_bahdanau_attention": {
        # the padded weights zeroed after a softmax over every position: the real ones no longer sum to 1
        "additive_attention": (
            "def additive_attention(query, projected_keys, values, mask, W_q, v_a):\n"
            "    scores = torch.tanh((query @ W_q.T)[:, None, :] + projected_keys) @ v_a\n"
            "    weights = torch.softmax(scores, dim=-1) * mask\n"
            "    return (weights[:, None, :] @ values)[:, 0], weights\n"
        ),
        # Bahdanau's order: the weights come from s_{i-1}, before the GRU update
        "luong_step": (
            "def luong_step(emb, state, enc_states, projected_keys, mask, cell, score, W_c):\n"
            "    from course_utils.blocks.scorers import attend\n"
            "    context, weights = attend(score(state, projected_keys), enc_states, mask)\n"
            "    state = cell(emb, state)\n"
            "    return state, context, torch.tanh(torch.cat([context, state], dim=-1) @ W_c.T), weights\n"
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
        # the padding keys are not masked, so a padding row can win
        "top_keys": (
            "def top_keys(x, lengths, W_q=None, W_k=None):\n"
            "    q = x if W_q is None else x @ W_q\n"
            "    k = x if W_k is None else x @ W_k\n"
            "    top = torch.softmax(q @ k.transpose(-2, -1), dim=-1).argmax(dim=-1)\n"
            "    return top.masked_fill(torch.arange(x.shape[1]) >= lengths[:, None], -1)\n"
        ),
    },
    "04_scaling": {
        # right values, but a NaN gradient at the masked keys: torch.where still takes log 0 in the backward pass
        # (the forward NaN, -(w * log w).sum(-1), is in tests/test_checks.py)
        "attention_entropy": (
            "def attention_entropy(weights):\n"
            "    terms = torch.where(weights > 0, weights * torch.log(weights), torch.zeros_like(weights))\n"
            "    return -terms.sum(dim=-1)\n"
        ),
        # the two runs swapped: "head width" trained with the model width's scale and the other way round
        "head_scale_runs": (
            "def head_scale_runs(config, H, seed=0):\n"
            "    from course_utils.experiments.scaling import train_recall\n"
            "    return {'head width': train_recall(config, seed=seed, scale=config.Dk ** -0.5, heads=H).losses,\n"
            "            'model width': train_recall(config, seed=seed, scale=(config.Dk // H) ** -0.5, heads=H).losses}\n"
        ),
        # measures the scaled softmax, which never saturates, instead of the unscaled one
        "saturation_width": (
            "def saturation_width(Dks, S, T, generator, threshold=0.9):\n"
            "    for Dk in Dks:\n"
            "        q = torch.randn(T, Dk, generator=generator)\n"
            "        k = torch.randn(S, Dk, generator=generator)\n"
            "        weights = torch.softmax(q @ k.T / Dk ** 0.5, dim=-1)\n"
            "        if weights.amax(dim=-1).mean() > threshold:\n"
            "            return Dk\n"
            "    return None\n"
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
        # reorders all D rows as if they were one head
        "to_rotate_half": (
            "def to_rotate_half(weight, num_heads):\n"
            "    D = weight.shape[0]\n"
            "    return weight[torch.cat([torch.arange(0, D, 2), torch.arange(1, D, 2)])]\n"
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
        # the self-attention without the causal mask: each position also reads the target positions after it
        "decoder_layer_forward": (
            "def decoder_layer_forward(state, x, memory, memory_mask, num_heads, norm_first, activation='relu'):\n"
            "    cross_mask = None if memory_mask is None else memory_mask[:, None]\n"
            "    def linear(name):\n"
            "        return lambda h: nn.functional.linear(h, state[name + '.weight'], state[name + '.bias'])\n"
            "    def norm(name):\n"
            "        return lambda h: layer_norm(h, state[name + '.weight'], state[name + '.bias'])\n"
            "    def attend(name, query, source, mask):\n"
            "        w_q, w_k, w_v = state[name + '.in_proj_weight'].chunk(3)\n"
            "        b_q, b_k, b_v = state[name + '.in_proj_bias'].chunk(3)\n"
            "        out, _ = multi_head_attention(query, source, source, lambda h: nn.functional.linear(h, w_q, b_q),\n"
            "                                      lambda h: nn.functional.linear(h, w_k, b_k),\n"
            "                                      lambda h: nn.functional.linear(h, w_v, b_v),\n"
            "                                      linear(name + '.out_proj'), num_heads, mask)\n"
            "        return out\n"
            "    act = nn.functional.gelu if activation == 'gelu' else nn.functional.relu\n"
            "    x = residual(x, lambda h: attend('self_attn', h, h, None), norm('norm1'), norm_first)\n"
            "    x = residual(x, lambda h: attend('multihead_attn', h, memory, cross_mask), norm('norm2'), norm_first)\n"
            "    return residual(x, lambda h: linear('linear2')(act(linear('linear1')(h))), norm('norm3'), norm_first)\n"
        ),
    },
    "08_training_deep_stacks": {
        # the bias correction forgotten: the step divides m_t by the square root of v_t as they are
        "adam_step": (
            "def adam_step(param, grad, m, v, t, lr, betas=(0.9, 0.999), eps=1e-8):\n"
            "    m = betas[0] * m + (1 - betas[0]) * grad\n"
            "    v = betas[1] * v + (1 - betas[1]) * grad ** 2\n"
            "    return param - lr * m / (v.sqrt() + eps), m, v\n"
        ),
    },
    "09_attention_at_scale": {
        # the running sum of values is not rescaled when the maximum grows
        "online_softmax_update": (
            "def online_softmax_update(m, l, acc, scores, v):\n"
            "    m_new = torch.maximum(m, scores.amax(dim=-1, keepdim=True))\n"
            "    p = torch.exp(scores - m_new)\n"
            "    return m_new, l * torch.exp(m - m_new) + p.sum(dim=-1, keepdim=True), acc + p @ v\n"
        ),
        # the diagonal tile is not masked: a query sees the later keys of its own block
        "causal_tiled_attention": (
            "def causal_tiled_attention(q, k, v, block_size):\n"
            "    from course_utils.experiments.efficiency import online_softmax_update\n"
            "    T, outs, tiles = q.shape[-2], [], 0\n"
            "    for start in range(0, T, block_size):\n"
            "        q_block = q[..., start:start + block_size, :]\n"
            "        m = torch.full((*q_block.shape[:-1], 1), float('-inf'))\n"
            "        l, acc = torch.zeros_like(m), torch.zeros((*q_block.shape[:-1], v.shape[-1]))\n"
            "        for k_start in range(0, start + 1, block_size):\n"
            "            scores = q_block @ k[..., k_start:k_start + block_size, :].transpose(-2, -1) / q.shape[-1] ** 0.5\n"
            "            m, l, acc = online_softmax_update(m, l, acc, scores, v[..., k_start:k_start + block_size, :])\n"
            "            tiles += 1\n"
            "        outs.append(acc / l)\n"
            "    return torch.cat(outs, dim=-2), tiles\n"
        ),
    },
    "10_small_gpt": {
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
    },
    "11_gpt_inference": {
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

# Kinds of mistakes the checkers above did not all try (issue 14): code that works only for the one shape a
# checker used to try, gradients cut by .detach() / torch.no_grad() / .data, a softmax without the max
# subtraction, one tensor used for another, wrong boundary handling, and answers that are (or call) the course's
# reference. {exercise: [(kind, source that defines the exercise's function, a word of the message that names it)]}.
# tests/test_checks.py requires each to be rejected with that word in the message, and no answer in it.
_SOFTMAX = "torch.softmax(scores.masked_fill(~mask, float('-inf')), dim=-1).nan_to_num(0.0)"
_MHA = ("def multi_head_attention(query, key, value, q_proj, k_proj, v_proj, out_proj, num_heads, mask=None):\n"
        "    from course_utils.blocks.attention import scaled_dot_product_attention\n"
        "    from course_utils.blocks.multihead import merge_heads, split_heads\n"
        "    q, k, v = (split_heads(p(t), num_heads) for p, t in ((q_proj, query), (k_proj, key), (v_proj, value)))\n"
        "    context, weights = scaled_dot_product_attention(q, k, v, mask)\n"
        "    return out_proj(merge_heads(context)), weights\n")
_ADDITIVE = ("def additive_attention(query, projected_keys, values, mask, W_q, v_a):\n"
             "    from course_utils.blocks.attention import masked_softmax\n"
             "    q_proj = query @ W_q.T\n"
             "    hidden = torch.tanh(q_proj[:, None, :] + projected_keys)\n"
             "    scores = hidden @ v_a\n"
             "    weights = masked_softmax(scores, mask)\n"
             "    context = (weights[:, None, :] @ values)[:, 0]\n"
             "    return context, weights\n")  # right: notebook 02's exercise, for the variants below
_LUONG = ("def luong_step(emb, state, enc_states, projected_keys, mask, cell, score, W_c):\n"
          "    from course_utils.blocks.scorers import attend\n"
          "    state = cell(emb, state)\n"
          "    scores = score(state, projected_keys)\n"
          "    context, weights = attend(scores, enc_states, mask)\n"
          "    both = torch.cat([context, state], dim=-1)\n"
          "    attentional = torch.tanh(both @ W_c.T)\n"
          "    return state, context, attentional, weights\n")
_DECODER_LAYER = (
    "def decoder_layer_forward(state, x, memory, memory_mask, num_heads, norm_first, activation='relu'):\n"
    "    from course_utils.blocks.masks import causal_mask\n"
    "    from course_utils.blocks.multihead import multi_head_attention\n"
    "    from course_utils.blocks.transformer import layer_norm, residual\n"
    "    causal = causal_mask(x.shape[1])\n"
    "    cross_mask = None if memory_mask is None else memory_mask[:, None]\n"
    "    def linear(name):\n"
    "        return lambda h: F.linear(h, state[name + '.weight'], state[name + '.bias'])\n"
    "    def norm(name):\n"
    "        return lambda h: layer_norm(h, state[name + '.weight'], state[name + '.bias'])\n"
    "    def attend(name, query, source, mask):\n"
    "        w_q, w_k, w_v = state[name + '.in_proj_weight'].chunk(3)\n"
    "        b_q, b_k, b_v = state[name + '.in_proj_bias'].chunk(3)\n"
    "        out, _ = multi_head_attention(query, source, source, lambda h: F.linear(h, w_q, b_q),\n"
    "                                      lambda h: F.linear(h, w_k, b_k), lambda h: F.linear(h, w_v, b_v),\n"
    "                                      linear(name + '.out_proj'), num_heads, mask)\n"
    "        return out\n"
    "    act = F.gelu if activation == 'gelu' else F.relu\n"
    "    x = residual(x, lambda h: attend('self_attn', h, h, causal), norm('norm1'), norm_first)\n"
    "    x = residual(x, lambda h: attend('multihead_attn', h, memory, cross_mask), norm('norm2'), norm_first)\n"
    "    return residual(x, lambda h: linear('linear2')(act(linear('linear1')(h))), norm('norm3'), norm_first)\n")
_LAST_LINE = "    return residual(x, lambda h: linear('linear2')(act(linear('linear1')(h))), norm('norm3'), norm_first)"
_CAUSAL = ("def causal_tiled_attention(q, k, v, block_size):\n"
           "    from course_utils.experiments.efficiency import online_softmax_update\n"
           "    T, outs, tiles = q.shape[-2], [], 0\n"
           "    for start in range(0, T, block_size):\n"
           "        q_block = q[..., start:start + block_size, :]\n"
           "        rows = torch.arange(start, start + q_block.shape[-2])\n"
           "        m = torch.full((*q_block.shape[:-1], 1), float('-inf'))\n"
           "        l, acc = torch.zeros_like(m), torch.zeros((*q_block.shape[:-1], v.shape[-1]))\n"
           "        for k_start in range(0, start + 1, block_size):\n"
           "            k_block, v_block = k[..., k_start:k_start + block_size, :], v[..., k_start:k_start + block_size, :]\n"
           "            scores = q_block @ k_block.transpose(-2, -1) / q.shape[-1] ** 0.5\n"
           "            if k_start == start:\n"
           "                cols = torch.arange(k_start, k_start + k_block.shape[-2])\n"
           "                scores = scores.masked_fill(cols[None, :] > rows[:, None], float('-inf'))\n"
           "            m, l, acc = online_softmax_update(m, l, acc, scores, v_block)\n"
           "            tiles += 1\n"
           "        outs.append(acc / l)\n"
           "    return torch.cat(outs, dim=-2), tiles\n")  # right: notebook 09's exercise 2, for the variants below
_CAUSAL_MASK = ("                cols = torch.arange(k_start, k_start + k_block.shape[-2])\n"
                "                scores = scores.masked_fill(cols[None, :] > rows[:, None], float('-inf'))\n")
# A right answer to notebook 03's exercise 2 (top_keys), written out without the course's functions; the buggy
# answers below change one thing in it.
_TOP_KEYS = ("def top_keys(x, lengths, W_q=None, W_k=None):\n"
             "    positions = torch.arange(x.shape[1])\n"
             "    q = x if W_q is None else x @ W_q\n"
             "    k = x if W_k is None else x @ W_k\n"
             "    keys = positions < lengths[:, None, None]\n"
             "    scores = (q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5).masked_fill(~keys, float('-inf'))\n"
             "    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)\n"
             "    top = weights.argmax(dim=-1)\n"
             "    return top.masked_fill(positions >= lengths[:, None], -1)\n")
# A right answer to notebook 04's exercise 3, as a learner might write it; the buggy answers change one thing in it.
_HEADS = ("def head_scale_runs(config, H, seed=0):\n"
          "    from course_utils.experiments.scaling import train_recall\n"
          "    Dh = config.Dk // H\n"
          "    return {'head width': train_recall(config, seed=seed, scale=1 / math.sqrt(Dh), heads=H).losses,\n"
          "            'model width': train_recall(config, seed=seed, scale=1 / math.sqrt(config.Dk), heads=H).losses}\n")

# A right answer to notebook 08's exercise (one Adam step); the buggy answers below change one thing in it.
_ADAM = ("def adam_step(param, grad, m, v, t, lr, betas=(0.9, 0.999), eps=1e-8):\n"
         "    beta1, beta2 = betas\n"
         "    m = beta1 * m + (1 - beta1) * grad\n"
         "    v = beta2 * v + (1 - beta2) * grad ** 2\n"
         "    m_hat = m / (1 - beta1 ** t)\n"
         "    v_hat = v / (1 - beta2 ** t)\n"
         "    return param - lr * m_hat / (v_hat.sqrt() + eps), m, v\n")
NEW_KINDS = {
    "padding_mask_for": [
        ("True marks the padding", "def padding_mask_for(lengths, scores):\n"
         "    real = torch.arange(scores.shape[-1]) >= lengths[:, None]\n"
         "    return real.view(len(lengths), *[1] * (scores.dim() - 2), scores.shape[-1])\n", "True marks the padding"),
        ("the full shape of the scores", "def padding_mask_for(lengths, scores):\n"
         "    real = torch.arange(scores.shape[-1]) < lengths[:, None]\n"
         "    return real.view(len(lengths), *[1] * (scores.dim() - 2), scores.shape[-1]).expand(scores.shape)\n",
         "full shape of the scores"),
        ("a squeeze that breaks at B = 1", "def padding_mask_for(lengths, scores):\n"
         "    real = (torch.arange(scores.shape[-1]) < lengths[:, None]).squeeze()\n"
         "    return real[:, *[None] * (scores.dim() - 2), :]\n", "B = 1"),
        ("calls the reference", "def padding_mask_for(lengths, scores):\n"
         "    from course_utils.blocks.masks import padding_mask_for as reference\n"
         "    return reference(lengths, scores)\n", "calls the course's reference"),
        ("builds on the course's padding_mask", "def padding_mask_for(lengths, scores):\n"
         "    from course_utils import padding_mask\n"
         "    return padding_mask(lengths, scores.shape[-1]).view(len(lengths), *[1] * (scores.dim() - 2), -1)\n",
         "calls the course's reference"),
    ],
    "masked_softmax": [
        ("unpacks three axes, so scores with heads fail", "def masked_softmax(scores, mask=None):\n"
         "    B, T, S = scores.shape\n"
         "    if mask is None:\n        return torch.softmax(scores, dim=-1)\n"
         "    weights = torch.softmax(scores.masked_fill(~mask, float('-inf')), dim=-1)\n"
         "    return weights.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)\n", "head axis"),
        ("unstable softmax (no max subtraction)", "def masked_softmax(scores, mask):\n"
         "    e = torch.exp(scores).masked_fill(~mask, 0.0)\n    total = e.sum(dim=-1, keepdim=True)\n"
         "    return torch.where(total > 0, e / total, torch.zeros_like(e))\n", "exp overflows"),
        ("detached output", f"def masked_softmax(scores, mask):\n    return {_SOFTMAX}.detach()\n",
         "cut off from autograd"),
        (".data", "def masked_softmax(scores, mask):\n"
         "    return torch.softmax(scores.data.masked_fill(~mask, float('-inf')), dim=-1).nan_to_num(0.0)\n",
         "cut off from autograd"),
        ("masks of one broadcastable shape only: (B, 1, S)", "def masked_softmax(scores, mask):\n"
         "    keep = mask[:, 0, :].any(dim=-1)[:, None, None]  # one row per sequence: only for (B, 1, S) masks\n"
         "    weights = torch.softmax(scores.masked_fill(~mask, -1e9), dim=-1)\n"
         "    return weights * keep\n", "(B, T, S)"),
        ("a squeeze that breaks at B = 1", f"def masked_softmax(scores, mask):\n    return {_SOFTMAX}.squeeze()\n",
         "B = 1"),
        ("calls the reference", "def masked_softmax(scores, mask):\n"
         "    from course_utils.blocks import attention\n    return attention.masked_softmax(scores, mask)\n",
         "calls the course's reference"),
        ("mask=None not handled", "def masked_softmax(scores, mask=None):\n"
         "    weights = torch.softmax(scores.masked_fill(~mask, float('-inf')), dim=-1)\n"
         "    return weights.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)\n", "mask=None"),
        ("NaN patched after the softmax, which hides a NaN in the scores", "def masked_softmax(scores, mask=None):\n"
         "    if mask is None:\n        return torch.softmax(scores, dim=-1)\n"
         "    return torch.softmax(scores.masked_fill(~mask, float('-inf')), dim=-1).nan_to_num(0.0)\n",
         "Patching NaN after the softmax"),
    ],
    "final_states": [
        ("a squeeze that breaks at B = 1 and R = 1", "def final_states(states, lengths):\n"
         "    index = (lengths - 1)[:, None, None].expand(-1, 1, states.shape[2])\n"
         "    return states.gather(1, index).squeeze()\n", "B = 1"),
        ("calls the reference", "def final_states(states, lengths):\n"
         "    from course_utils.blocks.seq2seq import final_states as reference\n"
         "    return reference(states, lengths)\n", "calls the course's reference"),
        ("a Python loop over the batch", "def final_states(states, lengths):\n"
         "    return torch.stack([states[b, lengths[b] - 1] for b in range(states.shape[0])])\n", "No Python loops"),
        ("a while loop over the batch", "def final_states(states, lengths):\n    rows, b = [], 0\n"
         "    while b < states.shape[0]:\n        rows.append(states[b, lengths[b] - 1])\n        b += 1\n"
         "    return torch.stack(rows)\n", "No Python loops"),
    ],
    "sequence_exact_match": [
        ("a prediction that ends early with padding is accepted", "def sequence_exact_match(tokens, targets, pad_id=0):\n"
         "    real = (targets != pad_id) & (tokens != pad_id)\n    return ((tokens == targets) | ~real).all(dim=1)\n",
         "stops early"),
        ("only the positions before the prediction's own <eos> are compared",
         "def sequence_exact_match(tokens, targets, pad_id=0):\n"
         "    before_eos = (tokens == 2).cumsum(dim=1) == 0\n"
         "    real = (targets != pad_id) & before_eos\n    return ((tokens == targets) | ~real).all(dim=1)\n",
         "stops early"),
        ("a squeeze that breaks at B = 1", "def sequence_exact_match(tokens, targets, pad_id=0):\n"
         "    return ((tokens == targets) | (targets == pad_id)).all(dim=1).squeeze()\n", "B = 1"),
        ("calls the reference", "def sequence_exact_match(tokens, targets, pad_id=0):\n"
         "    from course_utils.experiments.training import sequence_exact_match as reference\n"
         "    return reference(tokens, targets)\n", "calls the course's reference"),
        ("matching tokens counted, compared with the target's length", "def sequence_exact_match(tokens, targets, "
         "pad_id=0):\n    return (tokens == targets).sum(dim=1) == (targets != pad_id).sum(dim=1)\n",
         "padding written by the model matches the target's padding"),
        ("at least as many matching tokens as the target's length", "def sequence_exact_match(tokens, targets, "
         "pad_id=0):\n    return (tokens == targets).sum(dim=1) >= (targets != pad_id).sum(dim=1)\n",
         "padding written by the model matches the target's padding"),
    ],
    "beam_search": [
        ("greedy: a beam of one prefix", _BEAM.replace("[: beam_size - len(finished)]", "[:1]"),
         "greedy decoding's answer"),
        ("extensions ranked by the new token alone", _BEAM.replace(
            "(scores[:, None] + logits.log_softmax(dim=-1)).flatten()", "logits.log_softmax(dim=-1).flatten()").replace(
            "scores, state = candidates[kept], state[parent]", "scores, state = scores[parent] + candidates[kept], "
            "state[parent]"), "new token's log-probability alone"),
        ("the beam does not narrow", _BEAM.replace("[: beam_size - len(finished)]", "[: beam_size]").replace(
            "if len(y) == 0:", "if len(y) == 0 or len(finished) >= beam_size:"), "narrows by one"),
        ("the first hypothesis that finishes is the answer", _BEAM.replace(
            "score, tokens = max(finished, key=lambda hypothesis: hypothesis[0].item())", "score, tokens = finished[0]"),
         "first hypothesis that finished"),
        ("prefixes cut at max_len left out", _BEAM.replace(
            "finished += list(zip(scores, prefixes))", "finished = finished or list(zip(scores, prefixes))"),
         "cut at max_len"),
        ("the answer chosen by score per token", _BEAM.replace(
            "hypothesis[0].item())", "hypothesis[0].item() / len(hypothesis[1]))"), "divided by their length"),
        ("sums of logits", _BEAM.replace("logits.log_softmax(dim=-1)", "logits"), "sums of logits"),
        ("products of probabilities", _BEAM.replace(
            "(scores[:, None] + logits.log_softmax(dim=-1))", "(scores[:, None] * logits.softmax(dim=-1))").replace(
            "torch.zeros(1)\n", "torch.ones(1)\n"), "probabilities, not log-probabilities"),
        ("torch.topk, which fails when k > V", _BEAM.replace(
            "candidates.argsort(descending=True)[: beam_size - len(finished)]",
            "candidates.topk(beam_size - len(finished)).indices"), "fewer than beam_size if beam_size > V"),
        ("<sos> kept in the answer", _BEAM.replace("torch.zeros(1, 0, dtype=torch.long)", "torch.ones(1, 1, dtype=torch.long)"),
         "starts with <sos>"),
        ("<eos> dropped from the answer", _BEAM.replace("answers.append(tokens)", "answers.append(tokens[tokens != eos_id])"),
         "lost its <eos>"),
        ("padded with <eos>", _BEAM.replace("batch_first=True)", "batch_first=True, padding_value=2)"),
         "goes on after its <eos>"),
        ("the scores of the whole beam", _BEAM.replace("torch.stack(best)", "torch.stack(best)[:, None]"),
         "2 dimensions instead of 1"),
        ("a squeeze that breaks at B = 1", _BEAM.replace("torch.stack(best)", "torch.stack(best).squeeze()"), "B = 1"),
        ("the first source's context for every source", _BEAM.replace(
            "context.expand(len(y), -1)", "contexts[:1].expand(len(y), -1)"), "not the sums of the log-probabilities"),
        ("a weight changed in place", _BEAM.replace(
            "    answers, best = [], []\n", "    answers, best = [], []\n    model.decoder.out.bias.data[3] += 1.0\n"),
         "do not write"),
        ("each extension continues from the state at its own place in the beam, not its parent's", _BEAM.replace(
            "state[parent]", "state[torch.arange(len(kept)).clamp(max=len(state) - 1)]"), "from its parent's state"),
        ("the state not reindexed (repeated at the first step only)", _BEAM.replace(
            "state[parent]", "(state.expand(len(kept), -1) if len(state) == 1 else state)"), "from its parent's state"),
        ("calls the reference", "def beam_search(model, src, src_lengths, beam_size, max_len, sos_id=1, eos_id=2):\n"
         "    from course_utils.blocks.decoding import beam_search as search\n"
         "    return search(model, src, src_lengths, beam_size, max_len)\n", "calls the course's reference"),
    ],
    "additive_attention": [
        ("a Python loop over the batch", _ADDITIVE.replace(
            "    context = (weights[:, None, :] @ values)[:, 0]\n",
            "    context = torch.stack([weights[b] @ values[b] for b in range(len(values))])\n"), "Python loop"),
        ("the softmax over the batch axis", _ADDITIVE.replace(
            "masked_softmax(scores, mask)", "torch.softmax(scores.masked_fill(~mask, float('-inf')), dim=0)"),
         "ran over the batch"),
        ("the mask ignored", _ADDITIVE.replace("masked_softmax(scores, mask)", "torch.softmax(scores, dim=-1)"),
         "padding was not masked"),
        ("the mask inverted", _ADDITIVE.replace("masked_softmax(scores, mask)", "masked_softmax(scores, ~mask)"),
         "the mask is inverted"),
        ("the padded scores set to 0", _ADDITIVE.replace(
            "masked_softmax(scores, mask)", "torch.softmax(scores.masked_fill(~mask, 0.0), dim=-1)"), "exp(0) = 1"),
        ("the weights not normalised", _ADDITIVE.replace("masked_softmax(scores, mask)", "scores.exp() * mask"),
         "not normalised"),
        ("an unstable softmax (no max subtraction)", _ADDITIVE.replace(
            "masked_softmax(scores, mask)", "(scores.exp() * mask) / (scores.exp() * mask).sum(-1, keepdim=True)"),
         "overflows"),
        ("the context summed over the features", _ADDITIVE.replace(
            "(weights[:, None, :] @ values)[:, 0]", "(weights[:, :, None] * values).sum(-1)"),
         "summed over the Dk features"),
        ("every sequence's weights with every sequence's values", _ADDITIVE.replace(
            "(weights[:, None, :] @ values)[:, 0]", "weights @ values"), "every sequence's weights met"),
        ("the context from the projected keys", _ADDITIVE.replace(
            "(weights[:, None, :] @ values)[:, 0]", "(weights[:, None, :] @ projected_keys)[:, 0]"),
         "instead of the encoder states"),
        ("tanh missing", _ADDITIVE.replace("torch.tanh(q_proj[:, None, :] + projected_keys)",
                                           "q_proj[:, None, :] + projected_keys"), "tanh is missing"),
        ("tanh after v_a", _ADDITIVE.replace("    scores = hidden @ v_a\n", "    scores = torch.tanh(hidden @ v_a)\n")
         .replace("torch.tanh(q_proj[:, None, :] + projected_keys)", "q_proj[:, None, :] + projected_keys"),
         "tanh was applied after v_a"),
        ("W_q on the wrong side (its R and A axes swapped)", _ADDITIVE.replace("query @ W_q.T", "query @ W_q"),
         "wrong axis of W_q"),
        ("the query not projected", _ADDITIVE.replace("query @ W_q.T", "query"), "never projected"),
        ("the query not broadcast over the source positions", _ADDITIVE.replace(
            "q_proj[:, None, :] + projected_keys", "q_proj + projected_keys"), "of its own sequence"),
        ("(weights, context) returned", _ADDITIVE.replace("return context, weights", "return weights, context"),
         "wrong order"),
        (".data", _ADDITIVE.replace("hidden @ v_a", "hidden @ v_a.data"), "v_a"),
        ("a squeeze that breaks at B = 1", _ADDITIVE.replace(
            "(weights[:, None, :] @ values)[:, 0]", "(weights[:, None, :] @ values).squeeze()"), "B = 1"),
        ("calls the course's attend for the context", _ADDITIVE.replace(
            "    context = (weights[:, None, :] @ values)[:, 0]\n",
            "    from course_utils.blocks.scorers import attend\n"
            "    context = attend(scores, values, mask)[0]\n"), "calls the course's reference"),
        ("calls the reference", "def additive_attention(query, projected_keys, values, mask, W_q, v_a):\n"
         "    from course_utils.blocks.scorers import additive_attention as reference\n"
         "    return reference(query, projected_keys, values, mask, W_q, v_a)\n", "calls the course's reference"),
    ],
    "luong_step": [
        ("a Python loop over the batch", _LUONG.replace(
            "    context, weights = attend(scores, enc_states, mask)\n",
            "    weights = attend(scores, enc_states, mask)[1]\n"
            "    context = torch.stack([weights[b] @ enc_states[b] for b in range(len(weights))])\n"), "Python loop"),
        ("the two parts of [c_i; s_i] swapped", _LUONG.replace("[context, state]", "[state, context]"), "swapped"),
        ("tanh missing", _LUONG.replace("torch.tanh(both @ W_c.T)", "both @ W_c.T"), "tanh is missing"),
        ("the mask not passed", _LUONG.replace("enc_states, mask)", "enc_states)"), "mask was not passed"),
        ("scored against the values", _LUONG.replace("score(state, projected_keys)", "score(state, enc_states)"),
         "projected_keys"),
        ("the attentional layer reads s_{i-1}", _LUONG.replace("    state = cell(emb, state)\n", "    new = cell(emb, state)\n")
         .replace("score(state,", "score(new,").replace("return state, context", "return new, context"),
         "s_{i-1}, the state before the update"),
        ("the attentional state returned as the state", _LUONG.replace("return state, context", "return attentional, context"),
         "as the new state"),
        (".data", _LUONG.replace("W_c.T", "W_c.data.T"), "W_c"),
        ("a squeeze that breaks at B = 1", _LUONG.replace(
            "    context, weights = attend(scores, enc_states, mask)\n",
            "    weights = attend(scores, enc_states, mask)[1]\n"
            "    context = torch.bmm(weights[:, None, :], enc_states).squeeze()\n"), "B = 1"),
        ("calls the reference", "def luong_step(*args):\n"
         "    from course_utils.blocks import seq2seq\n    return seq2seq.luong_step(*args)\n",
         "calls the course's reference"),
    ],
    "scaled_dot_product_attention": [
        ("unstable softmax (no max subtraction)", "def scaled_dot_product_attention(q, k, v, mask=None, scale=None):\n"
         "    scale = q.shape[-1] ** -0.5 if scale is None else scale\n    e = torch.exp(q @ k.transpose(-2, -1) * scale)\n"
         "    if mask is not None:\n        e = e * mask\n"
         "    weights = e / e.sum(dim=-1, keepdim=True).clamp(min=1e-30)\n    return weights @ v, weights\n",
         "exp overflows"),
        ("detached output", "def scaled_dot_product_attention(q, k, v, mask=None, scale=None):\n"
         "    from course_utils.blocks.attention import masked_softmax\n"
         "    scale = q.shape[-1] ** -0.5 if scale is None else scale\n"
         "    weights = masked_softmax(q @ k.transpose(-2, -1) * scale, mask).detach()\n    return weights @ v, weights\n",
         "gradient with respect to q and k is zero"),
        (".data", "def scaled_dot_product_attention(q, k, v, mask=None, scale=None):\n"
         "    from course_utils.blocks.attention import masked_softmax\n"
         "    scale = q.shape[-1] ** -0.5 if scale is None else scale\n"
         "    weights = masked_softmax(q @ k.data.transpose(-2, -1) * scale, mask)\n    return weights @ v, weights\n",
         "gradient with respect to k is zero"),
        ("4-D-only code", "def scaled_dot_product_attention(q, k, v, mask=None, scale=None):\n"
         "    from course_utils.blocks.attention import masked_softmax\n"
         "    scale = q.shape[-1] ** -0.5 if scale is None else scale\n"
         "    weights = masked_softmax(q @ k.permute(0, 1, 3, 2) * scale, mask)\n    return weights @ v, weights\n",
         "3-D inputs"),
        ("a squeeze that breaks at H = 1", "def scaled_dot_product_attention(q, k, v, mask=None, scale=None):\n"
         "    from course_utils.blocks.attention import masked_softmax\n"
         "    scale = q.shape[-1] ** -0.5 if scale is None else scale\n"
         "    weights = masked_softmax(q @ k.transpose(-2, -1) * scale, mask)\n"
         "    return (weights @ v).squeeze(1), weights\n", "H = 1"),
        ("calls the reference", "def scaled_dot_product_attention(q, k, v, mask=None, scale=None):\n"
         "    import course_utils\n    return course_utils.scaled_dot_product_attention(q, k, v, mask, scale)\n",
         "calls the course's reference"),
        ("`scale or ...`, which takes scale=0.0 for None", "def scaled_dot_product_attention(q, k, v, mask=None, "
         "scale=None):\n    from course_utils.blocks.attention import masked_softmax\n"
         "    scale = scale or 1 / math.sqrt(q.shape[-1])\n"
         "    weights = masked_softmax(q @ k.transpose(-2, -1) * scale, mask)\n    return weights @ v, weights\n",
         "treats 0.0 as missing"),
        ("a guard that multiplies by mask.any: NaN * 0 is still NaN", "def scaled_dot_product_attention(q, k, v, "
         "mask=None, scale=None):\n    scale = q.shape[-1] ** -0.5 if scale is None else scale\n"
         "    scores = q @ k.transpose(-2, -1) * scale\n    if mask is not None:\n"
         "        scores = scores.masked_fill(~mask, float('-inf'))\n    weights = torch.softmax(scores, dim=-1)\n"
         "    if mask is not None:\n        weights = weights * mask.any(dim=-1, keepdim=True)\n"
         "    return weights @ v, weights\n", "weights are NaN"),
    ],
    "top_keys": [
        ("calls the reference", "def top_keys(x, lengths, W_q=None, W_k=None):\n"
         "    from course_utils.experiments import embeddings\n    return embeddings.top_keys(x, lengths, W_q, W_k)\n",
         "calls the course's reference"),
        ("real keys up to lengths[b], one too many", _TOP_KEYS.replace("< lengths[:, None, None]", "<= lengths[:, None, None]"),
         "the first padded one, was allowed"),
        ("a causal mask", _TOP_KEYS.replace("keys = positions < lengths[:, None, None]",
                                            "keys = (positions < lengths[:, None, None]) & (positions <= positions[:, None])"),
         "no causal mask"),
        ("the query's own key left out", _TOP_KEYS.replace("keys = positions < lengths[:, None, None]",
                                                           "keys = (positions < lengths[:, None, None]) & "
                                                           "(positions != positions[:, None])"),
         "own key was left out"),
        ("the largest weight along the queries", _TOP_KEYS.replace("weights.argmax(dim=-1)", "weights.argmax(dim=-2)"),
         "for each key, the query that weighs it most"),
        ("the smallest weight", _TOP_KEYS.replace("weights.argmax(dim=-1)", "weights.masked_fill(~keys, 2.0).argmin(dim=-1)"),
         "the key of the smallest weight"),
        ("padded queries keep their key", _TOP_KEYS.replace("top.masked_fill(positions >= lengths[:, None], -1)", "top"),
         "the padded queries got a key index"),
        ("padded queries get 0", _TOP_KEYS.replace("lengths[:, None], -1)", "lengths[:, None], 0)"),
         "the padded queries got 0"),
        ("projections ignored", _TOP_KEYS.replace("x if W_q is None else x @ W_q", "x").replace(
            "x if W_k is None else x @ W_k", "x"), "W_q and W_k were ignored"),
        ("q and k swapped", _TOP_KEYS.replace("q = x if W_q is None else x @ W_q", "q = x if W_k is None else x @ W_k")
         .replace("k = x if W_k is None else x @ W_k", "k = x if W_q is None else x @ W_q"), "q and k were swapped"),
        ("projections transposed", _TOP_KEYS.replace("x @ W_q", "x @ W_q.T").replace("x @ W_k", "x @ W_k.T"),
         "q = x @ W_q has shape (B, T, Dk)"),
        ("the weights returned", _TOP_KEYS.replace("return top.masked_fill(positions >= lengths[:, None], -1)",
                                                   "return weights"), "these look like the weights"),
        ("whether the query is its own top key", _TOP_KEYS.replace(
            "return top.masked_fill(positions >= lengths[:, None], -1)", "return top == positions"), "got a bool tensor"),
        ("the padding rows of x zeroed in place", _TOP_KEYS.replace(
            "    q = x if", "    x.masked_fill_((positions >= lengths[:, None])[..., None], 0.0)\n    q = x if"),
         "changed an input in place"),
    ],
    "attention_entropy": [
        ("3-D-only code", "def attention_entropy(weights):\n"
         "    return -(weights * weights.clamp(min=1e-30).log()).sum(dim=2)\n", "head axis"),
        ("a squeeze that breaks at B = 1", "def attention_entropy(weights):\n"
         "    return -(weights * weights.clamp(min=1e-30).log()).sum(dim=-1).squeeze()\n", "B = 1"),
        ("calls the reference", "def attention_entropy(weights):\n"
         "    from course_utils.blocks.attention import attention_entropy as entropy\n    return entropy(weights)\n",
         "calls the course's reference"),
    ],
    "head_scale_runs": [
        ("the scale applied twice", _HEADS.replace("scale=1 / math.sqrt(Dh)", "scale=1 / Dh"), "the scale applied twice"),
        ("no scale", _HEADS.replace("scale=1 / math.sqrt(Dh)", "scale=1.0"), "not scaled at all"),
        ("the divisor passed as the factor", _HEADS.replace("scale=1 / math.sqrt(Dh)", "scale=math.sqrt(Dh)"),
         "passed the divisor"),
        ("the model width scaled twice", _HEADS.replace("scale=1 / math.sqrt(config.Dk)", "scale=1 / config.Dk"),
         "1/Dk = 1/24"),
        ("both runs at the model width", _HEADS.replace("scale=1 / math.sqrt(Dh)", "scale=1 / math.sqrt(config.Dk)"),
         "the factor of the 'model width' run"),
        ("the number of heads as the width", _HEADS.replace("scale=1 / math.sqrt(Dh)", "scale=1 / math.sqrt(H)"),
         "the number of heads"),
        ("the embedding width as the model width", _HEADS.replace("math.sqrt(config.Dk)", "math.sqrt(config.D)"),
         "config.D is the width of the token embeddings"),
        ("one head", _HEADS.replace(", heads=H)", ")"), "one head"),
        ("the seed not passed on", _HEADS.replace("seed=seed", "seed=0"), "the run of seed 0"),
        ("the runs returned, not their losses", _HEADS.replace("heads=H).losses,\n", "heads=H),\n"),
         "each value is the list"),
        ("calls the reference", "def head_scale_runs(config, H, seed=0):\n"
         "    from course_utils.experiments import scaling\n    return scaling.head_scale_runs(config, H, seed)\n",
         "calls the course's reference"),
    ],
    "saturation_width": [
        ("a squeeze that breaks at S = 1", "def saturation_width(Dks, S, T, generator, threshold=0.9):\n"
         "    for Dk in Dks:\n"
         "        q, k = torch.randn(T, Dk, generator=generator), torch.randn(S, Dk, generator=generator)\n"
         "        if torch.softmax((q @ k.T).squeeze(), dim=-1).amax(dim=-1).mean() > threshold:\n"
         "            return Dk\n", "S = 1 key"),
        ("the global random generator", "def saturation_width(Dks, S, T, generator, threshold=0.9):\n"
         "    for Dk in Dks:\n"
         "        q, k = torch.randn(T, Dk), torch.randn(S, Dk)\n"
         "        if torch.softmax(q @ k.T, dim=-1).amax(dim=-1).mean() > threshold:\n"
         "            return Dk\n", "drew no numbers from `generator`"),
        ("calls the reference", "def saturation_width(Dks, S, T, generator, threshold=0.9):\n"
         "    from course_utils.experiments import scaling\n"
         "    return scaling.saturation_width(Dks, S, T, generator, threshold)\n", "calls the course's reference"),
    ],
    "split_heads": [
        # issue 34: "without a loop over the heads", and these passed
        ("heads sliced in a loop and stacked", "def split_heads(x, num_heads):\n    Dh = x.shape[-1] // num_heads\n"
         "    return torch.stack([x[..., h * Dh:(h + 1) * Dh] for h in range(num_heads)], 1)\n", "one at a time"),
        ("heads cut by chunk and stacked", "def split_heads(x, num_heads):\n"
         "    return torch.stack(x.chunk(num_heads, dim=-1), dim=1)\n", "one at a time"),
        ("heads written one by one into a new tensor", "def split_heads(x, num_heads):\n"
         "    B, T, D = x.shape\n    Dh = D // num_heads\n    out = x.new_zeros(B, num_heads, T, Dh)\n"
         "    for h in range(num_heads):\n"
         "        out = out.index_copy(1, torch.tensor([h]), x[:, None, :, h * Dh:(h + 1) * Dh])\n    return out\n",
         "once per head"),
        (".data", "def split_heads(x, num_heads):\n    B, T, D = x.shape\n"
         "    return x.data.view(B, T, num_heads, D // num_heads).transpose(1, 2)\n", "cut off from autograd"),
        ("a squeeze that breaks at B = 1", "def split_heads(x, num_heads):\n    B, T, D = x.shape\n"
         "    return x.view(B, T, num_heads, D // num_heads).transpose(1, 2).squeeze()\n", "B = 1"),
        ("calls the reference", "def split_heads(x, num_heads):\n"
         "    from course_utils.blocks.multihead import split_heads as split\n    return split(x, num_heads)\n",
         "calls the course's reference"),
    ],
    "merge_heads": [
        ("detached output", "def merge_heads(x):\n    B, H, T, Dh = x.shape\n"
         "    return x.transpose(1, 2).reshape(B, T, H * Dh).detach()\n", "cut off from autograd"),
        ("a squeeze that breaks at T = 1", "def merge_heads(x):\n    B, H, T, Dh = x.shape\n"
         "    return x.transpose(1, 2).reshape(B, T, H * Dh).squeeze()\n", "= 1"),
        ("calls the reference", "def merge_heads(x):\n"
         "    from course_utils.blocks import multihead\n    return multihead.merge_heads(x)\n",
         "calls the course's reference"),
    ],
    "multi_head_attention": [
        ("a loop over the heads", _MHA.replace(
            "    context, weights = scaled_dot_product_attention(q, k, v, mask)\n",
            "    from course_utils.blocks.attention import masked_softmax\n"
            "    per_head = [masked_softmax(q[:, h:h + 1] @ k[:, h:h + 1].transpose(-2, -1) / q.shape[-1] ** 0.5,\n"
            "                               None if mask is None or mask.dim() < 4 or mask.shape[1] == 1 else mask[:, h:h + 1])\n"
            "                for h in range(num_heads)]\n"
            "    weights = torch.cat(per_head, dim=1)\n"
            "    if mask is not None and (mask.dim() < 4 or mask.shape[1] == 1):\n"
            "        weights = masked_softmax(q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5, mask)\n"
            "    context = weights @ v\n"), "loops over the heads"),
        ("an inverted mask, nn.MultiheadAttention's convention", _MHA.replace(
            "    context, weights = scaled_dot_product_attention(q, k, v, mask)\n",
            "    from course_utils.blocks.attention import masked_softmax\n"
            "    weights = masked_softmax(q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5, None if mask is None else ~mask)\n"
            "    context = weights @ v\n"), "inverted"),
        # issue 34: "Do not call scaled_dot_product_attention ... Decide the scale", and these passed
        ("the course's scaled_dot_product_attention, no scale written", _MHA, "rules out"),
        ("F.scaled_dot_product_attention for the output", _MHA.replace(
            "    context, weights = scaled_dot_product_attention(q, k, v, mask)\n",
            "    from course_utils.blocks.attention import masked_softmax\n"
            "    context = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)\n"
            "    weights = masked_softmax(q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5, mask)\n"), "rules out"),
        ("k used as value", _MHA.replace("(v_proj, value)", "(v_proj, key)"), "computed from key"),
        ("detached output", _MHA.replace(
            "    context, weights = scaled_dot_product_attention(q, k, v, mask)\n",
            "    with torch.no_grad():\n        context, weights = scaled_dot_product_attention(q, k, v, mask)\n"),
         "cut off from autograd"),
        ("masks of one broadcastable shape only: (B, 1, 1, S)", _MHA.replace(
            "(q, k, v, mask)", "(q, k, v, None if mask is None else mask.view(mask.shape[0], 1, 1, -1))"), "mask"),
        ("no scale on the scores", _MHA.replace("(q, k, v, mask)", "(q, k, v, mask, 1.0)"), "not scaled at all"),
        ("calls the reference", "def multi_head_attention(*args):\n"
         "    from course_utils.blocks.multihead import multi_head_attention as mha\n    return mha(*args)\n",
         "calls the course's reference"),
    ],
    "to_rotate_half": [
        ("the inverse reordering", "def to_rotate_half(weight, num_heads):\n"
         "    D = weight.shape[0]\n    Dh = D // num_heads\n"
         "    return weight.reshape(num_heads, 2, Dh // 2, *weight.shape[1:]).transpose(1, 2).reshape(weight.shape)\n",
         "the other way"),
        ("in place", "def to_rotate_half(weight, num_heads):\n"
         "    D = weight.shape[0]\n    Dh = D // num_heads\n"
         "    rows = [h * Dh + n for h in range(num_heads) for n in [*range(0, Dh, 2), *range(1, Dh, 2)]]\n"
         "    weight.copy_(weight[rows])\n    return weight\n", "in place"),
        ("calls the reference", "def to_rotate_half(weight, num_heads):\n"
         "    from course_utils.blocks.positional import to_rotate_half as convert\n    return convert(weight, num_heads)\n",
         "calls the course's reference"),
    ],
    "apply_rotary": [
        ("3-D-only code", "def apply_rotary(x, positions=None):\n"
         "    from course_utils.blocks.positional import frequencies\n    B, T, Dk = x.shape\n"
         "    positions = torch.arange(T) if positions is None else positions\n"
         "    angles = positions[:, None].float() * frequencies(Dk)[None, :]\n"
         "    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)\n"
         "    pairs = x.view(B, T, Dk // 2, 2)\n    even, odd = pairs[..., 0], pairs[..., 1]\n"
         "    return torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).view(B, T, Dk)\n",
         "head axis"),
        ("detached output", "def apply_rotary(x, positions=None):\n"
         "    from course_utils.blocks.positional import frequencies\n    T, Dk = x.shape[-2:]\n"
         "    positions = torch.arange(T) if positions is None else positions\n"
         "    angles = positions[:, None].float() * frequencies(Dk)[None, :]\n"
         "    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)\n"
         "    even, odd = x[..., 0::2], x[..., 1::2]\n    out = torch.empty_like(x)\n"
         "    out[..., 0::2], out[..., 1::2] = even * cos - odd * sin, even * sin + odd * cos\n"
         "    return out.detach()\n", "cut off from autograd"),
        ("calls the reference", "def apply_rotary(x, positions=None):\n"
         "    from course_utils.blocks.multihead import apply_rotary as rotate\n    return rotate(x, positions)\n",
         "calls the course's reference"),
    ],
    "layer_norm": [
        # issue 36: written from what the text asks of each token (mean 0, variance var / (var + eps)), not from a
        # formula on screen; each of these gets its own message
        ("eps after the square root", "def layer_norm(x, weight, bias, eps=1e-5):\n    mean = x.mean(dim=-1, keepdim=True)\n"
         "    std = ((x - mean) ** 2).mean(dim=-1, keepdim=True).sqrt()\n"
         "    return (x - mean) / (std + eps) * weight + bias\n", "after the square root"),
        ("no eps", "def layer_norm(x, weight, bias, eps=1e-5):\n    mean = x.mean(dim=-1, keepdim=True)\n"
         "    variance = ((x - mean) ** 2).mean(dim=-1, keepdim=True)\n"
         "    return (x - mean) / variance.sqrt() * weight + bias\n", "eps is missing"),
        ("divided by the variance", "def layer_norm(x, weight, bias, eps=1e-5):\n    mean = x.mean(dim=-1, keepdim=True)\n"
         "    variance = ((x - mean) ** 2).mean(dim=-1, keepdim=True)\n"
         "    return (x - mean) / (variance + eps) * weight + bias\n", "divided by the variance itself"),
        ("statistics over the tokens", "def layer_norm(x, weight, bias, eps=1e-5):\n    mean = x.mean(dim=-2, keepdim=True)\n"
         "    variance = ((x - mean) ** 2).mean(dim=-2, keepdim=True)\n"
         "    return (x - mean) / torch.sqrt(variance + eps) * weight + bias\n", "over the tokens"),
        ("statistics over the whole tensor", "def layer_norm(x, weight, bias, eps=1e-5):\n    mean = x.mean()\n"
         "    variance = ((x - mean) ** 2).mean()\n"
         "    return (x - mean) / torch.sqrt(variance + eps) * weight + bias\n", "whole tensor"),
        ("statistics over the batch, as batch normalisation", "def layer_norm(x, weight, bias, eps=1e-5):\n"
         "    mean = x.mean(dim=0, keepdim=True)\n    variance = ((x - mean) ** 2).mean(dim=0, keepdim=True)\n"
         "    return (x - mean) / torch.sqrt(variance + eps) * weight + bias\n", "across the batch"),
        ("unstable variance, E[x²] - E[x]²", "def layer_norm(x, weight, bias, eps=1e-5):\n"
         "    mean = x.mean(dim=-1, keepdim=True)\n    variance = (x * x).mean(dim=-1, keepdim=True) - mean ** 2\n"
         "    return (x - mean) / torch.sqrt(variance + eps) * weight + bias\n", "far from 0"),
        (".data", "def layer_norm(x, weight, bias, eps=1e-5):\n    mean = x.mean(dim=-1, keepdim=True)\n"
         "    variance = ((x - mean) ** 2).mean(dim=-1, keepdim=True)\n"
         "    return (x - mean) / torch.sqrt(variance + eps) * weight.data + bias.data\n", "weight and bias"),
        ("3-D-only code", "def layer_norm(x, weight, bias, eps=1e-5):\n    mean = x.mean(dim=2, keepdim=True)\n"
         "    variance = ((x - mean) ** 2).mean(dim=2, keepdim=True)\n"
         "    return (x - mean) / torch.sqrt(variance + eps) * weight + bias\n", "without a batch axis"),
        ("F.layer_norm, which the exercise rules out", "def layer_norm(x, weight, bias, eps=1e-5):\n"
         "    return F.layer_norm(x, x.shape[-1:], weight, bias, eps)\n", "rules out"),
        ("eps ignored, 1e-5 written in", "def layer_norm(x, weight, bias, eps=1e-5):\n    mean = x.mean(dim=-1, keepdim=True)\n"
         "    variance = ((x - mean) ** 2).mean(dim=-1, keepdim=True)\n"
         "    return (x - mean) / torch.sqrt(variance + 1e-5) * weight + bias\n", "ignored its eps argument"),
        ("nn.LayerNorm, which the exercise rules out", "def layer_norm(x, weight, bias, eps=1e-5):\n"
         "    norm = torch.nn.LayerNorm(x.shape[-1], eps=eps)\n"
         "    return torch.func.functional_call(norm, {'weight': weight, 'bias': bias}, (x,))\n", "rules out"),
        ("calls the reference", "def layer_norm(x, weight, bias, eps=1e-5):\n"
         "    from course_utils.blocks.transformer import LayerNorm\n"
         "    return torch.func.functional_call(LayerNorm(x.shape[-1], eps), {'weight': weight, 'bias': bias}, (x,))\n",
         "calls the course's reference"),
    ],
    "is_pre_ln": [
        # issue 34: "whatever the gains and shifts"; passed while the checker's gains were 1 ± 0.5
        ("twice the input, about twice the output", "def is_pre_ln(block, D):\n    x = torch.randn(2, 5, D)\n"
         "    with torch.no_grad():\n        return bool(block(2 * x).norm() > 1.5 * block(x).norm())\n",
         "gains and shifts were small"),
        ("calls the reference", "def is_pre_ln(block, D):\n"
         "    from course_utils.blocks.transformer import is_pre_ln as reference\n    return reference(block, D)\n",
         "calls the course's reference"),
    ],
    "adam_step": [
        # issue 37: one Adam step from the description, checked beside torch.optim.Adam; each mistake named
    ("no bias correction", _ADAM.replace("m / (1 - beta1 ** t)", "m").replace("v / (1 - beta2 ** t)", "v"),
     "bias correction is missing"),
    ("the bias correction of m only", _ADAM.replace("v / (1 - beta2 ** t)", "v"), "only m is bias-corrected"),
    ("the bias correction of v only", _ADAM.replace("m / (1 - beta1 ** t)", "m"), "only v is bias-corrected"),
    ("eps inside the square root", _ADAM.replace("(v_hat.sqrt() + eps)", "(v_hat + eps).sqrt()"),
     "inside the square root"),
    ("no eps", _ADAM.replace("(v_hat.sqrt() + eps)", "v_hat.sqrt()"), "eps is missing"),
    ("eps before the correction of v, the paper's reordering", _ADAM.replace(
        "    return param - lr * m_hat / (v_hat.sqrt() + eps), m, v\n",
        "    step = lr * (1 - beta2 ** t) ** 0.5 / (1 - beta1 ** t)\n"
        "    return param - step * m / (v.sqrt() + eps), m, v\n"), "before v's correction"),
    ("g instead of g² in v", _ADAM.replace("grad ** 2", "grad"), "instead of its square"),
    ("|g| instead of g² in v", _ADAM.replace("grad ** 2", "grad.abs()"), "|g_t|"),
    ("t - 1 in the corrections", _ADAM.replace("** t)", "** (t - 1))"), "divided by zero"),
    ("t + 1 in the corrections", _ADAM.replace("** t)", "** (t + 1))"), "use t + 1"),
    ("the corrections of step 1 at every step", _ADAM.replace("** t)", ")"), "ignore t"),
    ("in place: m and v updated with mul_ and add_", _ADAM.replace(
        "    m = beta1 * m + (1 - beta1) * grad\n    v = beta2 * v + (1 - beta2) * grad ** 2\n",
        "    m.mul_(beta1).add_((1 - beta1) * grad)\n    v.mul_(beta2).add_((1 - beta2) * grad ** 2)\n"), "in place"),
    ("in place: the parameters updated with sub_", _ADAM.replace(
        "    return param - lr * m_hat / (v_hat.sqrt() + eps), m, v\n",
        "    param.sub_(lr * m_hat / (v_hat.sqrt() + eps))\n    return param, m, v\n"), "in place"),
    ("the step added, not subtracted", _ADAM.replace("param - lr", "param + lr"), "up the gradient"),
    ("divided by v, not its square root", _ADAM.replace("v_hat.sqrt()", "v_hat"), "not by its square root"),
    ("the step from the old m and v", _ADAM.replace(
        "    m = beta1 * m + (1 - beta1) * grad\n    v = beta2 * v + (1 - beta2) * grad ** 2\n    m_hat = m / (1 - beta1 ** t)\n    v_hat = v / (1 - beta2 ** t)\n",
        "    m_hat = m / (1 - beta1 ** t)\n    v_hat = v / (1 - beta2 ** t)\n"
        "    m = beta1 * m + (1 - beta1) * grad\n    v = beta2 * v + (1 - beta2) * grad ** 2\n"), "as they came in"),
    ("m's weights swapped", _ADAM.replace("beta1 * m + (1 - beta1) * grad", "(1 - beta1) * m + beta1 * grad"),
     "m's two weights are swapped"),
    ("v's weights swapped", _ADAM.replace("beta2 * v + (1 - beta2) * grad ** 2", "(1 - beta2) * v + beta2 * grad ** 2"),
     "v's two weights are swapped"),
    ("m averaged with beta2", _ADAM.replace("beta1 * m + (1 - beta1)", "beta2 * m + (1 - beta2)"), "with beta2"),
    ("the corrected m and v returned", _ADAM.replace(", m, v\n", ", m_hat, v_hat\n"), "bias-corrected one"),
    ("betas ignored", _ADAM.replace("    beta1, beta2 = betas\n", "    beta1, beta2 = 0.9, 0.999\n"),
     "ignored the betas"),
    ("eps ignored, 1e-8 written in", _ADAM.replace("+ eps)", "+ 1e-8)"), "ignored the eps"),
    ("lr ignored, 1e-3 written in", _ADAM.replace("param - lr *", "param - 1e-3 *"), "ignored the learning rate"),
    ("g in place of m", _ADAM.replace("lr * m_hat", "lr * grad"), "uses g_t where"),
    ("a list of two", _ADAM.replace(", m, v\n", ", (m, v)\n"), "three tensors"),
    ("torch.optim.Adam, which the exercise rules out",
     "def adam_step(param, grad, m, v, t, lr, betas=(0.9, 0.999), eps=1e-8):\n"
     "    p = torch.nn.Parameter(param.clone())\n"
     "    optimizer = torch.optim.Adam([p], lr=lr, betas=betas, eps=eps)\n"
     "    optimizer.state[p] = {'step': torch.tensor(float(t - 1)), 'exp_avg': m.clone(), 'exp_avg_sq': v.clone()}\n"
     "    p.grad = grad.clone()\n    optimizer.step()\n"
     "    return p.detach(), optimizer.state[p]['exp_avg'], optimizer.state[p]['exp_avg_sq']\n", "rules out"),
    ("calls the reference", "def adam_step(*args):\n"
     "    from course_utils.experiments.deep_stacks import adam_step as reference\n    return reference(*args)\n",
     "calls the course's reference"),
    ],
    "decoder_layer_forward": [
        ("the memory normalised by norm2 in a pre-LN layer", _DECODER_LAYER.replace(
            "h, memory, cross_mask)", "h, norm('norm2')(memory) if norm_first else memory, cross_mask)"),
         "normalised too"),
        ("memory_mask flipped to PyTorch's convention, masked with -inf",
         "def decoder_layer_forward(state, x, memory, memory_mask, num_heads, norm_first, activation='relu'):\n"
         "    D, H = x.shape[-1], num_heads\n"
         "    def attend(name, query, source, mask):\n"
         "        q, k, v = (F.linear(t, w, b) for t, w, b in zip((query, source, source),\n"
         "                   state[name + '.in_proj_weight'].chunk(3), state[name + '.in_proj_bias'].chunk(3)))\n"
         "        q, k, v = (t.view(t.shape[0], t.shape[1], H, D // H).transpose(1, 2) for t in (q, k, v))\n"
         "        scores = q @ k.transpose(-2, -1) / math.sqrt(D // H)\n"
         "        if mask is not None:\n"
         "            scores = scores.masked_fill(~mask, float('-inf'))\n"
         "        out = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(query.shape)\n"
         "        return F.linear(out, state[name + '.out_proj.weight'], state[name + '.out_proj.bias'])\n"
         "    norm = lambda name, h: F.layer_norm(h, (D,), state[name + '.weight'], state[name + '.bias'])\n"
         "    act = F.gelu if activation == 'gelu' else F.relu\n"
         "    ffn = lambda h: F.linear(act(F.linear(h, state['linear1.weight'], state['linear1.bias'])),\n"
         "                             state['linear2.weight'], state['linear2.bias'])\n"
         "    causal = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool).tril()\n"
         "    flipped = None if memory_mask is None else ~memory_mask[:, None]\n"
         "    if norm_first:\n"
         "        x = x + attend('self_attn', norm('norm1', x), norm('norm1', x), causal)\n"
         "        x = x + attend('multihead_attn', norm('norm2', x), memory, flipped)\n"
         "        return x + ffn(norm('norm3', x))\n"
         "    x = norm('norm1', x + attend('self_attn', x, x, causal))\n"
         "    x = norm('norm2', x + attend('multihead_attn', x, memory, flipped))\n"
         "    return norm('norm3', x + ffn(x))\n", "NaN"),
        ("detached output", _DECODER_LAYER.replace(_LAST_LINE, _LAST_LINE + ".detach()"), "cut off from autograd"),
        ("the tanh approximation of GELU", _DECODER_LAYER.replace(
            "act = F.gelu if", "act = (lambda h: F.gelu(h, approximate='tanh')) if"), "tanh approximation"),
        ("detached weights", _DECODER_LAYER.replace("    causal = causal_mask(x.shape[1])\n",
                                                    "    causal = causal_mask(x.shape[1])\n"
                                                    "    state = {name: t.detach() for name, t in state.items()}\n"),
         "self_attn.in_proj_weight"),
        ("a squeeze that breaks at B = 1", _DECODER_LAYER.replace(_LAST_LINE, _LAST_LINE + ".squeeze()"), "B = 1"),
        ("runs PyTorch's layer", "def decoder_layer_forward(state, x, memory, memory_mask, num_heads, norm_first, activation='relu'):\n"
         "    D = x.shape[-1]\n"
         "    layer = torch.nn.TransformerDecoderLayer(D, num_heads, state['linear1.weight'].shape[0], dropout=0.0,\n"
         "                                             batch_first=True, norm_first=norm_first, activation=activation)\n"
         "    causal = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool).tril()\n"
         "    ignore = None if memory_mask is None else ~memory_mask[:, 0]\n"
         "    return torch.func.functional_call(layer.eval(), state, (x, memory),\n"
         "                                      {'tgt_mask': ~causal, 'memory_key_padding_mask': ignore})\n",
         "runs PyTorch's layer"),
        ("calls PyTorch's attention", _DECODER_LAYER.replace(
            "    def attend(name, query, source, mask):\n",
            "    def attend(name, query, source, mask):\n"
            "        if name == 'self_attn':\n"
            "            q = query.transpose(0, 1)\n"
            "            out = F.multi_head_attention_forward(q, q, q, q.shape[-1], num_heads, state[name + '.in_proj_weight'],\n"
            "                state[name + '.in_proj_bias'], None, None, False, 0.0, state[name + '.out_proj.weight'],\n"
            "                state[name + '.out_proj.bias'], training=False, need_weights=False, attn_mask=~mask)[0]\n"
            "            return out.transpose(0, 1)\n"), "calls PyTorch's attention"),
        # from_torch copies under torch.no_grad(): the gradient check stops it before the reference guard would
        ("copies the weights with MultiHeadAttention.from_torch (no gradient reaches them)",
         "def decoder_layer_forward(state, x, memory, memory_mask, num_heads, norm_first, activation='relu'):\n"
         "    from course_utils.blocks.masks import causal_mask\n"
         "    from course_utils.blocks.multihead import MultiHeadAttention\n"
         "    from course_utils.blocks.transformer import layer_norm, residual\n"
         "    def attention(name):\n"
         "        theirs = torch.nn.MultiheadAttention(x.shape[-1], num_heads, batch_first=True)\n"
         "        theirs.load_state_dict({k[len(name) + 1:]: v for k, v in state.items() if k.startswith(name + '.')})\n"
         "        return MultiHeadAttention.from_torch(theirs)\n"
         "    sa, ca = attention('self_attn'), attention('multihead_attn')\n"
         "    norm = lambda name: (lambda h: layer_norm(h, state[name + '.weight'], state[name + '.bias']))\n"
         "    act = F.gelu if activation == 'gelu' else F.relu\n"
         "    ffn = lambda h: F.linear(act(F.linear(h, state['linear1.weight'], state['linear1.bias'])),\n"
         "                             state['linear2.weight'], state['linear2.bias'])\n"
         "    x = residual(x, lambda h: sa(h, mask=causal_mask(x.shape[1])), norm('norm1'), norm_first)\n"
         "    x = residual(x, lambda h: ca(h, memory, mask=memory_mask), norm('norm2'), norm_first)\n"
         "    return residual(x, ffn, norm('norm3'), norm_first)\n", "multihead_attn.out_proj.bias is zero"),
        ("calls the reference",
         "def decoder_layer_forward(state, x, memory, memory_mask, num_heads, norm_first, activation='relu'):\n"
         "    from course_utils.blocks.transformer import decoder_layer_forward as reference\n"
         "    return reference(state, x, memory, memory_mask, num_heads, norm_first, activation)\n",
         "calls the course's reference"),
    ],
    "online_softmax_update": [
        ("unstable (exp before the maximum is subtracted)", "def online_softmax_update(m, l, acc, scores, v):\n"
         "    m_new = torch.maximum(m, scores.amax(dim=-1, keepdim=True))\n"
         "    shift = m_new.masked_fill(m_new == float('-inf'), 0.0)\n"
         "    correction = torch.exp(m - shift)\n    p = torch.exp(scores) / torch.exp(shift)\n"
         "    return m_new, l * correction + p.sum(dim=-1, keepdim=True), acc * correction + p @ v\n", "±1e4"),
        ("2-D-only code", "def online_softmax_update(m, l, acc, scores, v):\n"
         "    m_new = torch.maximum(m, scores.max(dim=1, keepdim=True).values)\n"
         "    shift = m_new.masked_fill(m_new == float('-inf'), 0.0)\n"
         "    correction, p = torch.exp(m - shift), torch.exp(scores - shift)\n"
         "    return m_new, l * correction + p.sum(dim=1, keepdim=True), acc * correction + p @ v\n",
         "leading batch axis"),
        ("detached probabilities", "def online_softmax_update(m, l, acc, scores, v):\n"
         "    m_new = torch.maximum(m, scores.amax(dim=-1, keepdim=True))\n"
         "    shift = m_new.masked_fill(m_new == float('-inf'), 0.0)\n"
         "    correction, p = torch.exp(m - shift), torch.exp(scores - shift).detach()\n"
         "    return m_new, l * correction + p.sum(dim=-1, keepdim=True), acc * correction + p @ v\n",
         "gradient with respect to the scores"),
        ("the shift returned as m (0, not -inf, after a fully masked block)", "def online_softmax_update(m, l, acc, scores, v):\n"
         "    m_new = torch.maximum(m, scores.amax(dim=-1, keepdim=True))\n"
         "    shift = m_new.masked_fill(m_new == float('-inf'), 0.0)\n"
         "    correction, p = torch.exp(m - shift), torch.exp(scores - shift)\n"
         "    return shift, l * correction + p.sum(dim=-1, keepdim=True), acc * correction + p @ v\n",
         "running maximum must stay -inf"),
        ("calls the reference", "def online_softmax_update(m, l, acc, scores, v):\n"
         "    from course_utils.experiments import efficiency\n"
         "    return efficiency.online_softmax_update(m, l, acc, scores, v)\n", "calls the course's reference"),
    ],
    "next_token_loss": [
        # issue 34: passed while the checker's model had a context of T + 1; the notebook's model raises
        ("the model run on the whole window, its last position dropped", "def next_token_loss(model, tokens):\n"
         "    logits = model(tokens)[:, :-1]\n"
         "    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))\n",
         "whole window"),
        ("(B, T, V) logits passed to F.cross_entropy as they are", "def next_token_loss(model, tokens):\n"
         "    logits = model(tokens[:, :-1])\n    return F.cross_entropy(logits, tokens[:, 1:])\n",
         "reads the classes from dimension 1"),
        ("a squeeze that breaks at B = 1", "def next_token_loss(model, tokens):\n"
         "    inputs, targets = tokens[:, :-1].squeeze(), tokens[:, 1:].squeeze()\n    logits = model(inputs)\n"
         "    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))\n", "B = 1"),
        ("calls the reference", "def next_token_loss(model, tokens):\n"
         "    from course_utils.blocks.gpt import next_token_loss as loss\n    return loss(model, tokens)\n",
         "calls the course's reference"),
    ],
    "filter_logits": [
        # issue 34: the hidden tests alone passed these (the order of the two filters matters)
        ("top-p on the original distribution", "def filter_logits(logits, top_k=None, top_p=None):\n"
         "    out = logits\n    if top_k is not None:\n"
         "        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]\n"
         "        out = out.masked_fill(logits < kth, float('-inf'))\n"
         "    if top_p is not None:\n        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)\n"
         "        probs = torch.softmax(sorted_logits, dim=-1)\n        drop = probs.cumsum(dim=-1) - probs >= top_p\n"
         "        out = out.masked_fill(drop.scatter(-1, order, drop), float('-inf'))\n    return out\n",
         "original distribution"),
        ("top-p before top-k", "def filter_logits(logits, top_k=None, top_p=None):\n"
         "    if top_p is not None:\n        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)\n"
         "        probs = torch.softmax(sorted_logits, dim=-1)\n        drop = probs.cumsum(dim=-1) - probs >= top_p\n"
         "        logits = logits.masked_fill(drop.scatter(-1, order, drop), float('-inf'))\n"
         "    if top_k is not None:\n        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]\n"
         "        logits = logits.masked_fill(logits < kth, float('-inf'))\n    return logits\n",
         "original distribution"),
        ("code for (V,) and (B, V) logits only", "def filter_logits(logits, top_k=None, top_p=None):\n"
         "    if top_k is not None:\n        values = torch.topk(logits, top_k, dim=-1).values\n"
         "        kth = values[-1:] if logits.dim() == 1 else values[:, -1:]\n"
         "        logits = logits.masked_fill(logits < kth, float('-inf'))\n"
         "    if top_p is not None:\n        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)\n"
         "        probs = torch.softmax(sorted_logits, dim=-1)\n        drop = probs.cumsum(dim=-1) - probs >= top_p\n"
         "        logits = logits.masked_fill(drop.scatter(-1, order, drop), float('-inf'))\n    return logits\n",
         "(2, B, V)"),
        ("calls the reference", "def filter_logits(logits, top_k=None, top_p=None):\n"
         "    from course_utils.blocks import gpt\n    return gpt.filter_logits(logits, top_k, top_p)\n",
         "calls the course's reference"),
    ],
    "attend_with_cache": [
        ("head h reads group h % G", "def attend_with_cache(q, k, v, cache=None):\n"
         "    if cache is not None:\n"
         "        k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)\n"
         "    H, G, T, S = q.shape[1], k.shape[1], q.shape[2], k.shape[2]\n"
         "    keys, values = k.repeat(1, H // G, 1, 1), v.repeat(1, H // G, 1, 1)\n"
         "    mask = torch.ones(T, S, dtype=torch.bool).tril(diagonal=S - T)\n"
         "    scores = (q @ keys.transpose(-2, -1) / q.shape[-1] ** 0.5).masked_fill(~mask, float('-inf'))\n"
         "    return torch.softmax(scores, dim=-1) @ values, (k, v)\n", "h % G"),
        ("a squeeze that breaks at B = 1", "def attend_with_cache(q, k, v, cache=None):\n"
         "    from course_utils.blocks.gpt import grouped_attention\n    if cache is not None:\n"
         "        k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)\n"
         "    T, S = q.shape[2], k.shape[2]\n    mask = torch.ones(T, S, dtype=torch.bool).tril(diagonal=S - T)\n"
         "    return grouped_attention(q, k, v, mask).squeeze(0), (k, v)\n", "B = 1"),
        ("calls the reference", "def attend_with_cache(q, k, v, cache=None):\n"
         "    from course_utils.blocks.gpt import attend_with_cache as step\n    return step(q, k, v, cache)\n",
         "calls the course's reference"),
    ],
    "causal_tiled_attention": [
        # issue 34: no key tiles, no online softmax, the tile count by arithmetic; passed every check
        ("one ordinary softmax per query block over keys 0 .. end", "def causal_tiled_attention(q, k, v, block_size):\n"
         "    T, outs = q.shape[-2], []\n    for start in range(0, T, block_size):\n"
         "        q_block = q[..., start:start + block_size, :]\n        end = start + q_block.shape[-2]\n"
         "        scores = q_block @ k[..., :end, :].transpose(-2, -1) / q.shape[-1] ** 0.5\n"
         "        later = torch.arange(end)[None, :] > torch.arange(start, end)[:, None]\n"
         "        weights = torch.softmax(scores.masked_fill(later, float('-inf')), dim=-1)\n"
         "        outs.append(weights @ v[..., :end, :])\n    n = -(-T // block_size)\n"
         "    return torch.cat(outs, dim=-2), n * (n + 1) // 2\n", "one tile at a time"),
        # issue 37: the same with the softmax written out (e ** (scores - max)), which no exp or softmax call sees
        ("one hand-written softmax per query block over keys 0 .. end", "def causal_tiled_attention(q, k, v, block_size):\n"
         "    T, outs = q.shape[-2], []\n    for start in range(0, T, block_size):\n"
         "        q_block = q[..., start:start + block_size, :]\n        end = start + q_block.shape[-2]\n"
         "        scores = q_block @ k[..., :end, :].transpose(-2, -1) / q.shape[-1] ** 0.5\n"
         "        later = torch.arange(end)[None, :] > torch.arange(start, end)[:, None]\n"
         "        scores = scores.masked_fill(later, float('-inf'))\n"
         "        e = math.e ** (scores - scores.amax(dim=-1, keepdim=True))\n"
         "        outs.append(e / e.sum(dim=-1, keepdim=True) @ v[..., :end, :])\n    n = -(-T // block_size)\n"
         "    return torch.cat(outs, dim=-2), n * (n + 1) // 2\n", "score tile wider than C"),
        # lecturer's read: one query at a time, its scores by `*` and `.sum`, which no matrix-product count sees
        ("one query at a time with `*` and `.sum` over keys 0 .. i", "def causal_tiled_attention(q, k, v, block_size):\n"
         "    T, outs = q.shape[-2], []\n    for i in range(T):\n"
         "        scores = (q[..., i:i + 1, :] * k[..., :i + 1, :]).sum(dim=-1) / q.shape[-1] ** 0.5\n"
         "        weights = torch.softmax(scores, dim=-1)\n"
         "        outs.append((weights[..., :, None] * v[..., :i + 1, :]).sum(dim=-2, keepdim=True))\n"
         "    n = -(-T // block_size)\n    return torch.cat(outs, dim=-2), n * (n + 1) // 2\n",
         "elementwise product"),
        ("every tile computed, the upper ones masked away", _CAUSAL.replace(
            "range(0, start + 1, block_size)", "range(0, T, block_size)").replace(
            "if k_start == start:", "if k_start >= start:").replace("tiles += 1", "tiles += int(k_start <= start)"),
         "above the diagonal"),
        ("no mask in the diagonal tile", _CAUSAL.replace("if k_start == start:", "if False:"),
         "inside the diagonal tile"),
        ("the triangle mask on every tile", _CAUSAL.replace("if k_start == start:", "if True:").replace(
            "cols[None, :] > rows[:, None]", "(cols - k_start)[None, :] > (rows - start)[:, None]"), "every tile"),
        ("the diagonal tile skipped", _CAUSAL.replace("range(0, start + 1, block_size)", "range(0, start, block_size)"),
         "diagonal tile"),
        ("a query that does not see itself", _CAUSAL.replace("cols[None, :] > rows", "cols[None, :] >= rows"),
         "own key"),
        ("counts every tile, n²", _CAUSAL.replace("return torch.cat(outs, dim=-2), tiles",
                                                  "return torch.cat(outs, dim=-2), (-(-T // block_size)) ** 2"),
         "tiles above the diagonal are skipped"),
        ("a (T, T) mask sliced for each tile", _CAUSAL.replace(_CAUSAL_MASK, (
            "                allowed = torch.ones(T, T, dtype=torch.bool).tril()\n"
            "                scores = scores.masked_fill(~allowed[start:start + block_size, k_start:k_start + block_size],"
            " float('-inf'))\n")), "two axes of T"),
        ("naive causal attention, not tiled", "def causal_tiled_attention(q, k, v, block_size):\n"
         "    T = q.shape[-2]\n    n = -(-T // block_size)\n"
         "    scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5\n"
         "    scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float('-inf'))\n"
         "    return torch.softmax(scores, dim=-1) @ v, n * (n + 1) // 2\n", "two axes of T"),
        ("blocks by reshape: C must divide T", "def causal_tiled_attention(q, k, v, block_size):\n"
         "    *lead, T, Dk = q.shape\n    n = T // block_size\n"
         "    q_blocks = q.reshape(*lead, n, block_size, Dk)\n"
         "    return q_blocks.reshape(*lead, T, Dk)[..., :v.shape[-1]], n * (n + 1) // 2\n", "shorter"),
        ("4-D-only code", _CAUSAL.replace("q[..., start:start + block_size, :]", "q[:, :, start:start + block_size, :]"),
         "4-D"),
        ("detached scores", _CAUSAL.replace("scores = q_block @ k_block.transpose(-2, -1)",
                                            "scores = q_block.detach() @ k_block.detach().transpose(-2, -1)"),
         "cut off from autograd"),
        ("unscaled scores", _CAUSAL.replace(" / q.shape[-1] ** 0.5", ""), "not scaled"),
        ("no tile count", _CAUSAL.replace("return torch.cat(outs, dim=-2), tiles", "return torch.cat(outs, dim=-2)"),
         "return out, tiles"),
        ("F.scaled_dot_product_attention, which the exercise rules out", "def causal_tiled_attention(q, k, v, block_size):\n"
         "    n = -(-q.shape[-2] // block_size)\n"
         "    return F.scaled_dot_product_attention(q, k, v, is_causal=True), n * (n + 1) // 2\n", "rules out"),
        ("calls the reference", "def causal_tiled_attention(q, k, v, block_size):\n"
         "    from course_utils.experiments import efficiency\n"
         "    return efficiency.causal_tiled_attention(q, k, v, block_size)\n", "calls the course's reference"),
    ],
}

# Checkers a notebook runs without an exercise of its own: 00 writes pairwise_scores in view and shows its checker
# rejecting a version written with `.T`. The same kinds of wrong answer, each named by the checker.
CHECKER_ONLY_KINDS = {
    "pairwise_scores": [
        ("detached output", "def pairwise_scores(q, k):\n    return (q @ k.transpose(-2, -1)).detach()\n",
         "cut off from autograd"),
        (".data", "def pairwise_scores(q, k):\n    return q.data @ k.data.transpose(-2, -1)\n", "cut off from autograd"),
        ("a squeeze that breaks at B = 1", "def pairwise_scores(q, k):\n"
         "    return (q @ k.transpose(-2, -1)).squeeze()\n", "B = 1"),
        ("a squeeze that breaks at H = 1", "def pairwise_scores(q, k):\n"
         "    scores = q @ k.transpose(-2, -1)\n    return scores.squeeze(1) if scores.dim() == 4 else scores\n",
         "H = 1"),
        ("einsum, which the exercise rules out", "def pairwise_scores(q, k):\n"
         "    return torch.einsum('...td,...sd->...ts', q, k)\n", "einsum"),
        ("broadcast and sum, not `@`", "def pairwise_scores(q, k):\n"
         "    return (q[..., :, None, :] * k[..., None, :, :]).sum(dim=-1)\n", "without `@`"),
        ("a Python loop over the batch", "def pairwise_scores(q, k):\n"
         "    return torch.stack([q[b] @ k[b].transpose(-2, -1) for b in range(q.shape[0])])\n", "Python loop"),
        ("calls the reference", "def pairwise_scores(q, k):\n"
         "    import course_utils\n    return course_utils.pairwise_scores(q, k)\n", "calls the course's reference"),
    ],
}
