"""Reference code for the attention course.

Every notebook starts with ``from course_utils import setup; setup()``. Each
concept is written from scratch in the notebook that teaches it and lives here
once, so later notebooks import it instead of pasting it.

Modules (by concept):
    reproducibility  ``setup()``: seeds, threads, print options, figure style.
    checks           tolerant comparisons and exercise checkers with messages
                     that name the likely bug.
    masks            boolean masks (True = may attend).
    attention        pairwise scores and the masked softmax (notebook 00).
    data             the reversal and dates tasks, vocabularies, batching (01, 02).
    seq2seq          GRU encoder, plain and attention decoders, score functions (01, 02).
    training         training loop, exact match, the one-call length experiment (01, 02).
    plotting         figures (attention heatmaps, accuracy curves); each returns a Figure.
    grading          nbgrader release / autograde wrappers.
    execute          re-execute notebooks in place, deterministically.
"""

from course_utils.reproducibility import setup

__all__ = ["setup"]
__version__ = "0.1.0"
