"""Quantization formats ranked by how close they are to full precision (pure): what the precision policy
(routing.py) compares, and the values a routing file's `provider.quantizations` may hold (provider_object.py)."""
from __future__ import annotations

import re

# Precision order: higher is closer to full precision. Formats of the same width as the native one
# but another encoding (fp4 vs int4 QAT) are a lossy re-quantization, hence below it.
PRECISION_RANK: dict[str, float] = {
    "int2": 0, "int3": 0.5, "fp4": 1, "nvfp4": 1, "mxfp4": 1, "int4": 2, "fp6": 2.5, "int8": 3, "fp8": 3,
    "fp16": 4, "bf16": 4, "fp32": 5,
}

def precision_rank(quantization: str, ranks: dict[str, float] = PRECISION_RANK) -> float | None:
    """Rank of a format; an unlisted one is ranked by its bit width; None when it cannot be told."""
    q = quantization.lower()
    if q in ranks:
        return ranks[q]
    m = re.search(r"(\d+)", q)
    if not m:
        return None
    bits = int(m.group(1))
    same_width = [r for name, r in ranks.items() if (w := re.search(r"(\d+)", name)) and int(w.group(1)) == bits]
    return min(same_width) if same_width else (0.0 if bits < 4 else None)
