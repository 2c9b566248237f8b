"""What numpy's BLAS really runs, for the benchmarks that quote a ratio to it.

`OPENBLAS_CORETYPE` and `OPENBLAS_L2_SIZE` pin OpenBLAS to older kernels on some hosts here
(Haswell code on an AVX-512 core runs about half as fast), which flatters every ratio to numpy.
The benchmarks run with both unset and print the kernel threadpoolctl reports beside their
numpy figures, so a reader sees which BLAS the ratio is against.
"""

from __future__ import annotations

import os

PINNING = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


def blas_report() -> dict:
    """{'blas': 'openblas 0.3.x', 'kernel': 'SkylakeX', 'threads': 2, 'pinned': {...}} of this
    process's numpy (threadpoolctl when installed, numpy's build config otherwise)."""
    import numpy as np
    pinned = {k: os.environ[k] for k in PINNING if k in os.environ}
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        return {"blas": f"{blas.get('name')} {blas.get('version', '')}".strip(), "kernel": "unknown (no threadpoolctl)",
                "threads": None, "pinned": pinned}
    np.ones((2, 2)) @ np.ones((2, 2))   # the BLAS is loaded
    pools = [p for p in threadpool_info() if p.get("user_api") == "blas"]
    if not pools:
        return {"blas": "none found", "kernel": "unknown", "threads": None, "pinned": pinned}
    p = pools[0]
    return {"blas": f"{p.get('internal_api')} {p.get('version')}", "kernel": p.get("architecture"),
            "threads": p.get("num_threads"), "pinned": pinned}


def blas_line() -> str:
    r = blas_report()
    line = f"numpy's BLAS: {r['blas']}, kernel {r['kernel']}, {r['threads']} threads"
    if r["pinned"]:
        line += f" (pinned by {', '.join(f'{k}={v}' for k, v in r['pinned'].items())}: its figures are flattering us)"
    return line
