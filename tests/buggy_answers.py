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
}
