"""Per-operator cases for `python -m tilelang_ops diff` (see tilelang_ops/diff.py)."""
