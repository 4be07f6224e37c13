"""Building blocks: masks, attention, score functions, positions, multi-head attention,
transformer blocks, the seq2seq models and the small GPT of notebook 09. They import only ``course_utils.core`` and each other."""
