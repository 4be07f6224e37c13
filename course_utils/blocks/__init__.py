"""Building blocks: masks, attention, score functions, positions, multi-head attention,
transformer blocks, the seq2seq models and the small GPT of notebooks 10 and 11. They import only ``course_utils.core`` and each other."""
