"""Building blocks: masks, attention, score functions, positions, multi-head attention,
transformer blocks and the seq2seq models. They import only ``course_utils.core`` and each other."""
