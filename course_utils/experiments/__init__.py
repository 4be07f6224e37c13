"""What the notebooks measure, above the building blocks.

``loop`` (the one training loop), ``data`` and ``plotting`` sit at the bottom
of this layer; each experiment module imports them, never the other way round,
and no experiment imports another.
"""
