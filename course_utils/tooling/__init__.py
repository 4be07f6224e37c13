"""The course's own tools (execute, bench, release and grading, site, slides,
instructor guide). Notebooks never import this package."""
