"""Command line: ``python -m tilelang_ops <command>`` (``--help`` lists the commands)."""

from __future__ import annotations

import argparse
import sys


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m tilelang_ops",
        description="TileLang kernels for the compressed-KV and index path, diffed against their references.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    d = sub.add_parser(
        "diff", help="every kernel against its reference, one table per operator (make diff)",
        description="Run every kernel against its loop reference (CUDA), or without CUDA the reference "
                    "self-checks and the sm_90a build check; one table per operator.")
    d.add_argument("ops", nargs="*", metavar="OP", help="operators to diff (default: all)")
    d.add_argument("-v", "--verbose", action="store_true", help="show TileLang's compiler log lines")
    return p


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    if args.command is None:
        _parser().print_help()
        return 0
    if args.command == "diff":
        from tilelang_ops.diff import run_diff

        return run_diff(ops=args.ops or None, verbose=args.verbose)
    raise AssertionError(args.command)


if __name__ == "__main__":
    sys.exit(main())
