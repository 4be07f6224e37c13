"""Inside the sandbox: execute the notebook on standard input with nbgrader's ``Execute``, write it to a pipe.

:func:`course_utils.tooling.sandbox.execute` starts this file as a script (``python -P notebook_runner.py``), not
as a module of the package: importing ``course_utils`` imports torch, which this process never uses (the kernel it
starts imports what the notebook imports), and that would cost every graded notebook about a second of CPU. So this
file imports nothing of ``course_utils``.
"""

from __future__ import annotations

import argparse
import os
import sys

# jsonschema, which nbformat imports, imports rfc3987_syntax when it is installed (jupyter-events requires it), and
# that module builds a parser of the IRI grammar as it is imported: about a second of CPU in every process that
# reads a notebook. Nothing here validates IRIs; without the module, jsonschema leaves those two formats unchecked.
sys.modules.setdefault("rfc3987_syntax", None)


def read_stdin() -> bytes:
    """All of standard input (what the grader handed in), then standard input closed."""
    data = sys.stdin.buffer.read()
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    return data


def run(timeout: int, result_fd: int) -> int:
    """Execute the notebook read from stdin, in the current folder, with nbgrader's Execute; write it to ``result_fd``."""
    import nbformat
    from nbgrader.preprocessors import Execute

    os.set_inheritable(result_fd, False)  # the kernel must not inherit the result pipe
    out = os.fdopen(result_fd, "w", encoding="utf-8")
    nb = nbformat.reads(read_stdin().decode("utf-8"), as_version=4)  # nothing of it is on disk for the kernel
    executor = Execute(timeout=timeout, interrupt_on_timeout=True, allow_errors=True)
    nb, _ = executor.preprocess(nb, {"metadata": {"path": os.getcwd()}})  # the sandbox's work folder
    out.write(nbformat.writes(nb))
    out.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="(inside the sandbox) execute the notebook on stdin for autograding")
    parser.add_argument("--timeout", type=int, required=True)
    parser.add_argument("--result-fd", type=int, required=True)
    args = parser.parse_args(argv)
    return run(args.timeout, args.result_fd)


if __name__ == "__main__":
    sys.exit(main())
