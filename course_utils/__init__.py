"""Reference code for the attention course, in four layers.

Every notebook starts with ``from course_utils import setup; setup()``. Each
concept is written in the notebook that teaches it and lives here once, so
later notebooks import it instead of pasting it. A layer imports only from
the layers below it (import-linter checks this in the test suite):

    tooling       the course's own tools: execute, bench, release and grading,
                  site, slides, instructor guide. Notebooks never import it.
    checks        exercise checkers, one module per notebook, over ``checks.core``
                  (tolerant comparisons, messages that name the likely bug).
    experiments   what the notebooks measure: ``loop`` (the one training loop)
                  and ``data`` and ``plotting`` at the bottom; above them one
                  module per experiment (``training`` 01-02 and 07, ``embeddings``
                  03, ``scaling`` 04, ``neighbours`` 05, ``order`` 06,
                  ``deep_stacks`` 08, ``efficiency`` 09, ``language_model`` 10 and 11).
    blocks        the models: ``masks``, ``attention`` (00, 03, 04),
                  ``scorers`` and ``seq2seq`` (01, 02), ``positional`` (06),
                  ``multihead`` (05), ``transformer`` (07), ``gpt`` (10, 11).
    core          ``errors``, ``portable`` (pinned CPU code paths),
                  ``reproducibility`` (``setup``, ``error_bound``).

The names the notebooks use most are importable from the package itself.
"""

# Before any submodule computes with torch: the pinned code paths (see course_utils.core.portable).
from course_utils.core.portable import pin_environment as _pin_environment

_pin_environment()

from course_utils.core.errors import CheckError, InputError
from course_utils.core.reproducibility import error_bound, setup
from course_utils.blocks.attention import (
    attention_entropy,
    masked_softmax,
    pairwise_scores,
    scaled_dot_product_attention,
    scaled_scores,
    validate_attention_inputs,
)
from course_utils.blocks.gpt import generate_with_cache
from course_utils.blocks.masks import causal_mask, padding_mask, padding_mask_for
from course_utils.blocks.multihead import (
    MultiHeadAttention,
    RotaryProjection,
    ablate_head,
    attention_cost,
    merge_heads,
    multi_head_attention,
    split_heads,
)
from course_utils.blocks.positional import (
    apply_rotary,
    apply_rotary_half,
    frequencies,
    rotate_half,
    shift_matrix,
    sinusoidal_positional_encoding,
    to_rotate_half,
    validate_positions,
)
from course_utils.blocks.transformer import (
    FeedForward,
    LayerNorm,
    TransformerDecoderBlock,
    TransformerEncoderBlock,
    TransformerSeq2Seq,
    block_from_torch,
    decoder_layer_forward,
    is_pre_ln,
    layer_norm,
    residual,
)
from course_utils.experiments.deep_stacks import (
    ReversalStack,
    StackRun,
    WarmupConfig,
    WithoutResidual,
    adam_step,
    gradient_norms_by_layer,
    gradient_norms_without_residual,
    reversal_batch,
    step_sizes,
    train_reversal_stack,
)
from course_utils.experiments.efficiency import (
    LayerTimes,
    SelfAttentionLayer,
    causal_tiled_attention,
    online_softmax_update,
    page_faults,
    peak_memory_curve,
    peak_memory_curves,
    peak_memory_mb,
    tiled_attention,
    time_call,
    time_layers,
)
from course_utils.experiments.neighbours import (
    NeighbourConfig,
    NeighbourModel,
    NeighbourResult,
    head_offset_profile,
    make_neighbour_batch,
    neighbour_accuracy,
    neighbour_test_set,
    train_neighbour_model,
)
from course_utils.experiments.order import (
    IGNORE,
    POSITION_KINDS,
    CopyConfig,
    CopyResult,
    OrderBlock,
    OrderModel,
    OrderResult,
    ReversalConfig,
    RotarySelfAttention,
    make_copy_batch,
    make_reversal_batch,
    train_copy_model,
    train_order_model,
)

# The building blocks' and experiments' public names, importable from the package itself
# (tests/test_multihead_positional.py keeps this list complete).
__all__ = [
    "CheckError",
    "InputError",
    "error_bound",
    "FeedForward",
    "LayerNorm",
    "LayerTimes",
    "MultiHeadAttention",
    "NeighbourConfig",
    "NeighbourModel",
    "NeighbourResult",
    "CopyConfig",
    "CopyResult",
    "IGNORE",
    "OrderBlock",
    "OrderModel",
    "OrderResult",
    "POSITION_KINDS",
    "ReversalConfig",
    "RotaryProjection",
    "RotarySelfAttention",
    "SelfAttentionLayer",
    "TransformerDecoderBlock",
    "TransformerEncoderBlock",
    "TransformerSeq2Seq",
    "block_from_torch",
    "decoder_layer_forward",
    "causal_tiled_attention",
    "is_pre_ln",
    "ReversalStack",
    "StackRun",
    "WarmupConfig",
    "WithoutResidual",
    "train_reversal_stack",
    "ablate_head",
    "apply_rotary",
    "apply_rotary_half",
    "attention_cost",
    "attention_entropy",
    "causal_mask",
    "frequencies",
    "generate_with_cache",
    "adam_step",
    "gradient_norms_by_layer",
    "gradient_norms_without_residual",
    "reversal_batch",
    "step_sizes",
    "head_offset_profile",
    "layer_norm",
    "make_neighbour_batch",
    "make_copy_batch",
    "make_reversal_batch",
    "masked_softmax",
    "merge_heads",
    "multi_head_attention",
    "neighbour_accuracy",
    "neighbour_test_set",
    "online_softmax_update",
    "padding_mask",
    "padding_mask_for",
    "pairwise_scores",
    "page_faults",
    "peak_memory_curve",
    "peak_memory_curves",
    "peak_memory_mb",
    "residual",
    "rotate_half",
    "scaled_dot_product_attention",
    "scaled_scores",
    "setup",
    "shift_matrix",
    "sinusoidal_positional_encoding",
    "split_heads",
    "tiled_attention",
    "to_rotate_half",
    "time_call",
    "time_layers",
    "train_neighbour_model",
    "train_copy_model",
    "train_order_model",
    "validate_attention_inputs",
    "validate_positions",
]
__version__ = "0.1.0"
