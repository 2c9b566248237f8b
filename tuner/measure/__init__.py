"""Build and measure candidates: a parallel builder pool and runners (local, or the farm's agents).

    with BuilderPool(timeout=20) as builder, LocalRunner(MeasureOptions(timeout=10)) as runner:
        results = runner.run(task, builder.build(task, candidates))

`RPCRunner(tracker, device_key, options=...)` is a drop-in for LocalRunner that measures on
device agents through the farm's tracker; both take one MeasureOptions (compiler/measure_options.py).

The measuring code itself lives in `device_agent.worker` so that device agents run exactly it.
"""

from compiler.measure_options import MeasureOptions

from .builder import BuilderPool, BuildResult
from .rpc_runner import FarmAuthError, FarmError, FarmRequestError, FarmTLSError, RPCRunner
from .runner import LocalRunner, Runner

__all__ = ["MeasureOptions", "BuildResult", "BuilderPool", "FarmAuthError", "FarmError", "FarmRequestError", "FarmTLSError", "LocalRunner",
           "RPCRunner", "Runner"]
