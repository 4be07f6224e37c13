"""The course's own tools (execute, bench, release and grading, site, slides,
instructor guide). Notebooks never import this package."""

# Imported first, by every tool, for the one thing it does on import: it keeps jsonschema (through nbformat) from
# importing rfc3987_syntax, about a second of CPU per process (see the comment at its top).
from course_utils.tooling import notebook_runner as _notebook_runner  # noqa: F401
