"""Checks with messages a learner can act on (introduced in notebook 00).

A common core and one module per notebook:

* generic helpers: ``check_tensor`` (type, shape, dtype, NaN), ``check_close``
  (values, with a list of known mistakes to recognise), ``call`` (runs a
  learner's function and turns ``None``, ``NotImplementedError`` or any other
  exception into a short message), ``expect_failure`` (shows a check catching
  a bug, for the "Common pitfalls" sections);
* machinery every checker shares, in ``checks.core``: ``check_gradients``
  (backward through the learner's function and the reference, input
  gradients compared), ``shape_cases`` and ``sweep`` (every shape the
  exercise allows: B = 1, H = 1, sizes that all differ, other numbers of
  leading axes) and ``reference_guard`` (rejects a function that is, or
  calls, the course's reference for the same job);
* build, then use, in ``checks.flow``: an exercise left open does not stop a
  learner's notebook, ``answer_or_reference`` gives the cells after an exercise
  the learner's function once it passes (the reference until then), and
  ``compare_guess`` ends a prediction;
* exercise checkers, named after the concept they check
  (``check_padding_mask_for``, ``check_pairwise_scores``, ``check_masked_softmax``),
  each taking the learner's function and raising ``CheckError`` whose message
  says what was expected, what came back and what to look at.

The core is :mod:`course_utils.checks.core`, with :mod:`course_utils.checks.inspection`
over it (how a learner's function is written: Python loops, the torch functions
it calls); the checkers of notebook NN live in the module named after its topic
(``orientation`` for 00, ``bottleneck`` for 01, ...; notebook 01's beam search
has its own, ``beam``). Everything is importable from ``course_utils.checks``.
Every checker is tested against known-buggy answers in ``tests/test_checks.py``.
"""

from course_utils.checks.hints import hint
from course_utils.checks.flow import answer_or_reference, compare_guess, exercise_check, show_model_answer
from course_utils.checks.core import (
    describe,
    call,
    check_tensor,
    check_close,
    expect_failure,
    passed,
)
from course_utils.checks.bahdanau import (
    check_additive_attention,
    check_attend,
    check_attention_step,
    check_bilinear_scores,
)
from course_utils.checks.beam import check_beam_search
from course_utils.checks.luong import check_luong_step
from course_utils.checks.bottleneck import (
    check_final_states,
    check_sequence_exact_match,
)
from course_utils.checks.efficiency import (
    check_causal_tiled_attention,
    check_online_softmax_update,
)
from course_utils.checks.gpt import (
    check_attend_with_cache,
    check_filter_logits,
    check_next_token_loss,
)
from course_utils.checks.multihead import (
    check_split_heads,
    check_merge_heads,
    check_multi_head_attention,
)
from course_utils.checks.orientation import (
    check_padding_mask_for,
    check_pairwise_scores,
    check_masked_softmax,
)
from course_utils.checks.positional import (
    check_sinusoidal_positional_encoding,
    check_to_rotate_half,
    check_apply_rotary,
)
from course_utils.checks.scaling import (
    check_attention_entropy,
    check_attention_scale,
    check_saturation_width,
    check_head_scale_runs,
)
from course_utils.checks.self_attention import (
    check_scaled_dot_product_attention,
    check_top_keys,
)
from course_utils.checks.deep_stacks import check_adam_step
from course_utils.checks.transformer import (
    check_decoder_layer_forward,
    check_is_pre_ln,
    check_layer_norm,
)
from course_utils.core.errors import CheckError


__all__ = [
    "hint",
    "answer_or_reference",
    "compare_guess",
    "exercise_check",
    "CheckError",
    "call",
    "check_additive_attention",
    "check_attend_with_cache",
    "check_beam_search",
    "check_apply_rotary",
    "check_attention_entropy",
    "check_attention_scale",
    "check_attend",
    "check_attention_step",
    "check_bilinear_scores",
    "check_causal_tiled_attention",
    "check_close",
    "check_filter_logits",
    "check_final_states",
    "check_sequence_exact_match",
    "check_sinusoidal_positional_encoding",
    "check_to_rotate_half",
    "check_masked_softmax",
    "check_merge_heads",
    "check_multi_head_attention",
    "check_next_token_loss",
    "check_online_softmax_update",
    "check_decoder_layer_forward",
    "check_adam_step",
    "check_is_pre_ln",
    "check_layer_norm",
    "check_luong_step",
    "check_padding_mask_for",
    "check_pairwise_scores",
    "check_scaled_dot_product_attention",
    "check_head_scale_runs",
    "check_saturation_width",
    "check_split_heads",
    "check_tensor",
    "check_top_keys",
    "describe",
    "expect_failure",
    "passed",
]
