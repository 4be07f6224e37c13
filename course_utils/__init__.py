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

from course_utils.attention import masked_softmax, scaled_dot_product_attention
from course_utils.masks import causal_mask, padding_mask
from course_utils.multihead import MultiHeadAttention, merge_heads, multi_head_attention, split_heads
from course_utils.positional import apply_rotary, sinusoidal_positional_encoding
from course_utils.reproducibility import setup
from course_utils.transformer import TransformerDecoderBlock, TransformerEncoderBlock

__all__ = [
    "MultiHeadAttention",
    "TransformerDecoderBlock",
    "TransformerEncoderBlock",
    "apply_rotary",
    "causal_mask",
    "masked_softmax",
    "merge_heads",
    "multi_head_attention",
    "padding_mask",
    "scaled_dot_product_attention",
    "setup",
    "sinusoidal_positional_encoding",
    "split_heads",
]
__version__ = "0.1.0"
