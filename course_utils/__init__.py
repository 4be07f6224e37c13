"""Reference code for the attention course.

Every notebook starts with ``from course_utils import setup; setup()``. Each
concept is written from scratch in the notebook that teaches it and lives here
once, so later notebooks import it instead of pasting it.

Modules (by concept):
    reproducibility  ``setup()``: seeds, threads, print options, figure style.
    checks           tolerant comparisons and exercise checkers with messages
                     that name the likely bug.
    errors           CheckError (a failed exercise check), InputError (bad input).
    masks            boolean masks (True = may attend): padding (00), causal (03).
    attention        pairwise scores, masked softmax (00); scaled dot-product
                     attention (03); entropy and per-head scaled scores (04).
    embeddings       Word2Vec on a corpus shipped with gensim, sentence matrices (03).
    multihead        splitting into heads, MultiHeadAttention with from_torch (05).
    positional       sinusoidal, learned and rotary position information (06).
    transformer      LayerNorm, residual blocks, encoder/decoder blocks, a small transformer (07).
    efficiency       time and memory at scale, tiled attention with an online softmax (08).
    scaling          the measurements behind the 1/sqrt(Dk) scale (04).
    data             the reversal and dates tasks, vocabularies, batching (01, 02).
    seq2seq          GRU encoder, plain and attention decoders, score functions (01, 02).
    training         training loop, exact match, the one-call length experiment (01, 02).
    plotting         figures (attention heatmaps, accuracy curves); each returns a Figure.
    grading          nbgrader release / autograde wrappers.
    execute          re-execute notebooks in place, deterministically.
"""

# Before any submodule computes with torch: the pinned code paths (see course_utils.portable).
from course_utils.portable import pin_environment as _pin_environment

_pin_environment()

from course_utils.attention import (
    attention_entropy,
    masked_softmax,
    pairwise_scores,
    scaled_dot_product_attention,
    scaled_scores,
    validate_attention_inputs,
)
from course_utils.efficiency import (
    LayerTimes,
    SelfAttentionLayer,
    online_softmax_update,
    peak_memory_mb,
    tiled_attention,
    time_call,
    time_layers,
)
from course_utils.masks import causal_mask, padding_mask
from course_utils.multihead import (
    MultiHeadAttention,
    NeighbourConfig,
    NeighbourModel,
    NeighbourResult,
    RotaryProjection,
    ablate_head,
    attention_cost,
    head_offset_profile,
    make_neighbour_batch,
    merge_heads,
    multi_head_attention,
    neighbour_accuracy,
    neighbour_test_set,
    split_heads,
    train_neighbour_model,
)
from course_utils.positional import (
    POSITION_KINDS,
    OrderModel,
    OrderResult,
    ReversalConfig,
    apply_rotary,
    frequencies,
    make_reversal_batch,
    shift_matrix,
    sinusoidal_positional_encoding,
    train_order_model,
    validate_positions,
)
from course_utils.reproducibility import error_bound, setup
from course_utils.transformer import (
    FeedForward,
    LayerNorm,
    TransformerDecoderBlock,
    TransformerEncoderBlock,
    TransformerSeq2Seq,
    gradient_norms_by_layer,
    layer_norm,
    residual,
)

# The attention modules' public names, importable from the package itself
# (tests/test_multihead_positional.py keeps this list complete).
__all__ = [
    "FeedForward",
    "LayerNorm",
    "LayerTimes",
    "MultiHeadAttention",
    "NeighbourConfig",
    "NeighbourModel",
    "NeighbourResult",
    "OrderModel",
    "OrderResult",
    "POSITION_KINDS",
    "ReversalConfig",
    "RotaryProjection",
    "SelfAttentionLayer",
    "TransformerDecoderBlock",
    "TransformerEncoderBlock",
    "TransformerSeq2Seq",
    "ablate_head",
    "apply_rotary",
    "attention_cost",
    "attention_entropy",
    "causal_mask",
    "frequencies",
    "gradient_norms_by_layer",
    "head_offset_profile",
    "layer_norm",
    "make_neighbour_batch",
    "make_reversal_batch",
    "masked_softmax",
    "merge_heads",
    "multi_head_attention",
    "neighbour_accuracy",
    "neighbour_test_set",
    "online_softmax_update",
    "padding_mask",
    "pairwise_scores",
    "peak_memory_mb",
    "residual",
    "scaled_dot_product_attention",
    "scaled_scores",
    "error_bound",
    "setup",
    "shift_matrix",
    "sinusoidal_positional_encoding",
    "split_heads",
    "tiled_attention",
    "time_call",
    "time_layers",
    "train_neighbour_model",
    "train_order_model",
    "validate_attention_inputs",
    "validate_positions",
]
__version__ = "0.1.0"
