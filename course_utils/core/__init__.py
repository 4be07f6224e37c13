"""The bottom layer: errors, pinned CPU code paths, ``setup``. Imports nothing else of the course."""
