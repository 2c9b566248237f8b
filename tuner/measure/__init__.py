"""Build and measure candidates: a parallel builder pool and runners (local; the farm's next).

    with BuilderPool(timeout=20) as builder, LocalRunner(timeout=10) as runner:
        results = runner.run(task, builder.build(task, candidates))

The measuring code itself lives in `device_agent.worker` so that device agents run exactly it.
"""

from .builder import BuilderPool, BuildResult
from .runner import LocalRunner, Runner

__all__ = ["BuildResult", "BuilderPool", "LocalRunner", "Runner"]
