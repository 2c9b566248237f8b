"""tunefarm as an ONNX backend (`onnx.backend.base.Backend`), so ONNX's own backend test suite
(`onnx.backend.test.BackendTest`, whose node tests the installed onnx generates in memory) can
run against the graph compiler:

    import onnx.backend.test
    suite = onnx.backend.test.BackendTest(TunefarmBackend, __name__)
    suite.include(r"test_relu_.*")

Every model is compiled by `from_onnx` + `build_model` with the default schedules. The node tests
feed what tunefarm needs at compile time (a Reshape's shape, a Slice's starts, Clip's bounds) as
graph inputs, so compiling waits for the first `run`: the inputs the compiler asks to be constants
(ShapeError.needs_constant) are frozen into the model with the values given, and the compiled
model is kept for later runs with the same frozen values.
"""

from __future__ import annotations

import numpy as np
from onnx import numpy_helper
from onnx.backend.base import Backend, BackendRep

from .errors import ShapeError
from .onnx_import import from_onnx
from .runtime import build_model


class TunefarmBackendRep(BackendRep):
    """A model compiled on first use; `run` takes the inputs in the model's order (or by name)."""

    def __init__(self, model):
        self.model = model
        init = {i.name for i in model.graph.initializer}
        self.input_names = [i.name for i in model.graph.input if i.name not in init]
        self._compiled: dict = {}   # frozen inputs' (name, bytes) -> (module, frozen names)
        self._frozen: set = set()

    def run(self, inputs, **kwargs):
        if isinstance(inputs, dict):
            feeds = {k: np.asarray(v) for k, v in inputs.items()}
        else:
            feeds = {k: np.asarray(v) for k, v in zip(self.input_names, [inputs] if isinstance(inputs, np.ndarray)
                                                       else inputs)}
        module = self._module(feeds)
        return tuple(module.run(**{k: v for k, v in feeds.items() if k in module.input_names}))

    def _module(self, feeds):
        while True:
            key = tuple(sorted((n, feeds[n].tobytes()) for n in self._frozen))
            if key in self._compiled:
                return self._compiled[key]
            try:
                module = build_model(from_onnx(self._freeze(feeds)))
            except ShapeError as e:
                name = e.needs_constant
                if name is None or name not in feeds or name in self._frozen:
                    raise
                self._frozen.add(name)
                continue
            self._compiled[key] = module
            return module

    def _freeze(self, feeds):
        model = type(self.model)()
        model.CopyFrom(self.model)
        g = model.graph
        for name in self._frozen:
            g.initializer.append(numpy_helper.from_array(feeds[name], name))
        kept = [i for i in g.input if i.name not in self._frozen]
        del g.input[:]
        g.input.extend(kept)
        return model


class TunefarmBackend(Backend):
    @classmethod
    def prepare(cls, model, device: str = "CPU", **kwargs) -> TunefarmBackendRep:
        super().prepare(model, device, **kwargs)
        return TunefarmBackendRep(model)

    @classmethod
    def run_model(cls, model, inputs, device: str = "CPU", **kwargs):
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return device == "CPU"


__all__ = ["TunefarmBackend", "TunefarmBackendRep"]
