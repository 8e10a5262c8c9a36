"""Split top-k rows (DSMEM, cluster barriers) under compute-sanitizer, each case checked against the oracle.
CUDA only; on the H200 (ae521bc): every case equal, ERROR SUMMARY: 0 errors.

    compute-sanitizer --tool memcheck --leak-check no python tools/sanitize_topk_split.py
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch  # noqa: E402

import tilelang_ops.topk as tk  # noqa: E402
from reference.topk import topk_torch  # noqa: E402
from tests.test_topk import make_end, make_scores, poison_beyond_end  # noqa: E402

torch.manual_seed(0)
for dist, b, n, k, split, dtype in (("randn", 2, 65536, 2048, 4, torch.float32),
                                    ("equal", 1, 131072, 2048, 4, torch.float32),
                                    ("unsampled", 2, 65536, 2048, 2, torch.float32),
                                    ("special", 1, 200000, 3000, 4, torch.bfloat16),
                                    ("randn", 3, 20000, 4096, 4, torch.float32)):
    tk.MAX_SPLIT = split
    x = make_scores(dist, b, n, dtype, device="cuda")
    end = make_end("random", b, n, k, device="cuda")
    x = poison_beyond_end(x, end)
    _, i = tk.topk(x, k, end=end, sorted_index=True)
    _, ri = topk_torch(x, k, end=end, sorted_index=True)
    torch.cuda.synchronize()
    print("SAN", dist, b, n, k, split, "equal" if torch.equal(i, ri) else "MISMATCH", flush=True)
