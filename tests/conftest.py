import random

import numpy as np
import pytest
import torch

HAS_CUDA = torch.cuda.is_available()

# GPU-tier tests carry this mark; they skip on CPU-only machines (CI) and run on the H200.
requires_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")


@pytest.fixture(autouse=True)
def _seed_everything():
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    yield


def case_id(case) -> str:
    """Readable pytest ids from dataclass cases: their `id` field or their repr."""
    return getattr(case, "id", None) or repr(case)
