"""Errors of the model compiler: each names the file, node or input it is about.

All are `GraphError`s (a `CompilerError`, a `ValueError`), so a caller can catch one type for any
bad model or bad run-time input; the subclasses say which kind of bad input it was.
"""

from __future__ import annotations

from ..errors import CompilerError


class GraphError(CompilerError, ValueError):
    """A model the compiler cannot take, or inputs a compiled model cannot run on."""


class NotOnnxError(GraphError):
    """The file or bytes are not an ONNX model."""


class UnsupportedModelError(GraphError):
    """Operators (or attributes of them) the compiler does not support. One error lists every
    offending node, so a user learns the whole gap at once, not one node per attempt.

    `problems`: [(op_type, node name, reason)]."""

    def __init__(self, problems):
        self.problems = list(problems)
        types = sorted({p[0] for p in self.problems})
        lines = [f"  {op} node {name!r}: {reason}" for op, name, reason in self.problems]
        super().__init__(f"the model uses {len(self.problems)} node(s) tunefarm cannot compile "
                         f"(op types: {', '.join(types)}):\n" + "\n".join(lines))


class DynamicShapeError(GraphError):
    """An input whose shape is not fixed in the model and not pinned by `input_shapes`."""


class ShapeError(GraphError):
    """Shapes (or constant values a node needs at compile time) that do not fit a node.

    `needs_constant`: the value that had to be a compile-time constant and was not (a Reshape's
    shape fed as a graph input), else None."""

    def __init__(self, message: str, needs_constant: str | None = None):
        super().__init__(message)
        self.needs_constant = needs_constant


class InputError(GraphError):
    """Inputs given to a compiled model's `run` that do not match its inputs (names, shapes,
    dtypes)."""


__all__ = ["GraphError", "NotOnnxError", "UnsupportedModelError", "DynamicShapeError", "ShapeError", "InputError"]
