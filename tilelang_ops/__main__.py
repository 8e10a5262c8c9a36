import sys

from tilelang_ops.diff import run_diff

USAGE = "usage: python -m tilelang_ops diff"

if __name__ == "__main__":
    if sys.argv[1:] != ["diff"]:
        sys.exit(USAGE)
    sys.exit(run_diff())
