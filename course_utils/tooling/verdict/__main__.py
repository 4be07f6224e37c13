"""``python -m course_utils.tooling.verdict --coverage NOTEBOOK...``: what each exercise checks out of the kernel."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from course_utils.tooling.verdict.scoring import coverage


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_utils.tooling.verdict",
                                     description="The out-of-kernel verdict (used by `make grade`).")
    parser.add_argument("--coverage", nargs="+", type=Path, metavar="NOTEBOOK", required=True,
                        help="list what each graded exercise of these notebooks checks out of the kernel")
    args = parser.parse_args(argv)
    for line in coverage(args.coverage):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
