"""Loop-style torch references, one module per operator (same names as the kernels, `_ref` suffix).

Import from the modules: ``reference.compress``, ``reference.kv_store``, ``reference.compress_store``,
``reference.topk``.
"""
