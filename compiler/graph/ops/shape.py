"""Shape and data-movement operators.

- The reshape family (Reshape, Flatten, Squeeze, Unsqueeze, Dropout at inference) moves no data:
  ALIAS nodes, whose output the runtime gives the input's buffer. A Dropout's mask output, all
  true at inference, becomes a constant (canonical_ops.constant_dropout_masks), so a model that
  exports it (the onnx zoo's VGG, SqueezeNet, AlexNet) compiles whether or not anything reads it.
- Shape, Size, Constant, ConstantOfShape and Range produce constants at compile time (shapes are
  static), so the Shape → Gather → Concat → Reshape chains of exported models fold away.
- Gather, Concat, Transpose, Slice, Expand and Pad are injective: each output element reads one
  input element, expressed as an index map over the input's Lazy read, so chains of them (and
  elementwise neighbours) fuse into one stage.
"""

from __future__ import annotations

import math

import numpy as np

from ... import expr as E
from ..errors import ShapeError
from ..ir import Value
from .base import Kind, Lazy, axis_of, broadcast, broadcast_shapes, const_input, data_index, ints, register, same_dtype
from .elementwise import ONNX_DTYPES

# ----------------------------------------------------------------------------- aliases


def _reshape_target(node, ins, opset):
    shape = [int(s) for s in const_input(node, ins, 1, "shape")]
    src = ins[0].shape
    allowzero = int(node.attrs.get("allowzero", 0))
    out = [src[i] if s == 0 and not allowzero else s for i, s in enumerate(shape)]
    if out.count(-1) > 1:
        raise ShapeError(f"Reshape node {node.name!r}: more than one -1 in the shape {shape}")
    if -1 in out:
        known = math.prod(s for s in out if s != -1)
        if known == 0 or math.prod(src) % known:
            raise ShapeError(f"Reshape node {node.name!r}: cannot reshape {src} to {shape}")
        out[out.index(-1)] = math.prod(src) // known
    if math.prod(out) != math.prod(src) or any(s < 0 for s in out):
        raise ShapeError(f"Reshape node {node.name!r}: cannot reshape {src} ({math.prod(src)} elements) to {shape}")
    return tuple(out)


def _flatten_target(node, ins, opset):
    src = ins[0].shape
    axis = int(node.attrs.get("axis", 1))
    axis = axis + len(src) if axis < 0 else axis
    if not 0 <= axis <= len(src):
        raise ShapeError(f"Flatten node {node.name!r}: axis {node.attrs.get('axis')} out of range for rank {len(src)}")
    return (math.prod(src[:axis]), math.prod(src[axis:]))


def _axes(node, ins, opset, since: int):
    """Axes from the attribute (before opset `since`) or the second input (from it)."""
    if opset >= since and len(ins) > 1 and ins[1] is not None:
        return [int(a) for a in const_input(node, ins, 1, "axes")]
    a = node.attrs.get("axes")
    return None if a is None else [int(x) for x in a]


def _squeeze_target(node, ins, opset):
    src = ins[0].shape
    axes = _axes(node, ins, opset, 13)
    if axes is None:
        return tuple(s for s in src if s != 1)
    axes = {axis_of(node, a, len(src)) for a in axes}
    for a in axes:
        if src[a] != 1:
            raise ShapeError(f"Squeeze node {node.name!r}: axis {a} has size {src[a]}, not 1")
    return tuple(s for i, s in enumerate(src) if i not in axes)


def _unsqueeze_target(node, ins, opset):
    src = list(ins[0].shape)
    axes = _axes(node, ins, opset, 13)
    if axes is None:
        raise ShapeError(f"Unsqueeze node {node.name!r}: no axes")
    rank = len(src) + len(axes)
    axes = sorted(axis_of(node, a, rank) for a in axes)
    out = list(src)
    for a in axes:
        out.insert(a, 1)
    return tuple(out)


ALIAS_TARGETS = {
    "Reshape": _reshape_target,
    "Flatten": _flatten_target,
    "Squeeze": _squeeze_target,
    "Unsqueeze": _unsqueeze_target,
    "Dropout": lambda node, ins, opset: ins[0].shape,
    "Identity": lambda node, ins, opset: ins[0].shape,
}


def _alias(op_type):
    target = ALIAS_TARGETS[op_type]

    def infer(node, ins, opset):
        outs = [(target(node, ins, opset), ins[0].dtype)]
        if op_type == "Dropout":
            _check_dropout_inference(node, ins)
            if len(node.outputs) > 1 and node.outputs[1]:
                outs.append((ins[0].shape, dropout_mask_dtype(ins[0].dtype, opset)))
        return outs

    def fold(node, arrays, opset):
        out = [arrays[0].reshape(target(node, _ConstView.of(arrays, node), opset))]
        if op_type == "Dropout" and len(node.outputs) > 1 and node.outputs[1]:
            out.append(np.ones(arrays[0].shape, dropout_mask_dtype(str(arrays[0].dtype), opset)))
        return out

    def lower(node, xs, ins, opset):
        return reshaped(xs[0], target(node, ins, opset))

    register(op_type, Kind.ALIAS, infer, lower, fold)


def reshaped(x: Lazy, shape: tuple) -> Lazy:
    """x read under another shape of the same size (row-major), as an index map: used when an
    ALIAS node sits inside a fused group (FromNCHWc → Reshape → Transpose → Reshape → ToNCHWc,
    a channel shuffle, is one pass). The shapes are cut into runs of equal product, so only the
    axes a run splits or merges pay a division (ShuffleNet's [N, C, H, W] → [N, G, C/G, H, W]:
    the channel index alone)."""
    shape = tuple(int(s) for s in shape)
    if tuple(x.shape) == shape:
        return x
    runs = _equal_product_runs(tuple(x.shape), shape)

    def read(idx):
        src: list = []
        for (i0, i1), (o0, o1) in runs:
            if i1 - i0 == 1 and o1 - o0 == 1:
                src.append(idx[o0])
                continue
            linear = None
            for d in range(o0, o1):
                if shape[d] == 1:
                    continue
                linear = idx[d] if linear is None else linear * shape[d] + idx[d]
            for d in range(i0, i1):
                if x.shape[d] == 1 or linear is None:
                    src.append(0)
                    continue
                inner = math.prod(x.shape[d + 1:i1])
                q = linear // inner if inner > 1 else linear
                src.append(q % x.shape[d] if d > i0 else q)
        return x.read(tuple(src))
    return Lazy(shape, x.dtype, read)


def _equal_product_runs(a: tuple, b: tuple) -> list:
    """((a_start, a_end), (b_start, b_end)) runs of two shapes of one size whose products match,
    each as short as possible."""
    if 0 in a or 0 in b:
        return [((0, len(a)), (0, len(b)))]
    runs, i, j = [], 0, 0
    while i < len(a) or j < len(b):
        i0, j0 = i, j
        pa = a[i] if i < len(a) else 1
        pb = b[j] if j < len(b) else 1
        i, j = min(i + 1, len(a)), min(j + 1, len(b))
        while pa != pb:
            if pa < pb:
                pa *= a[i]
                i += 1
            else:
                pb *= b[j]
                j += 1
        while i < len(a) and a[i] == 1 and (j >= len(b) or b[j] != 1):   # trailing ones join the run
            i += 1
        while j < len(b) and b[j] == 1 and (i >= len(a) or a[i] != 1):
            j += 1
        runs.append(((i0, i), (j0, j)))
    return runs


def dropout_mask_dtype(dtype: str, opset: int) -> str:
    """Dropout's mask is bool from opset 10, of the data's dtype before."""
    return "bool" if opset >= 10 else dtype


def _check_dropout_inference(node, ins):
    """Dropout passes its input through and its mask is all true, at inference (no training_mode
    input, or a constant false one) and when training with a constant ratio of 0 (nothing is
    dropped); training with a non-zero ratio drops at random, which a compiled model does not."""
    if len(ins) < 3 or ins[2] is None:
        return
    training = const_input(node, ins, 2, "training_mode")
    if not bool(np.asarray(training).reshape(-1)[0]):
        return
    ratio = const_input(node, ins, 1, "ratio") if len(ins) > 1 and ins[1] is not None else None
    if ratio is None or float(np.asarray(ratio).reshape(-1)[0]) != 0.0:
        raise ShapeError(f"Dropout node {node.name!r}: training_mode=True with a non-zero ratio (only inference "
                         "is compiled, where Dropout passes its input through)")


class _ConstView:
    """Values standing for constant arrays, so the alias targets read them one way."""

    def __init__(self, array):
        self.const, self.shape, self.name, self.dtype = array, tuple(array.shape), "const", str(array.dtype)

    @staticmethod
    def of(arrays, node):
        return [None if a is None else _ConstView(a) for a in arrays]


for _op in ALIAS_TARGETS:
    _alias(_op)


# ----------------------------------------------------------------------------- compile-time constants

register("Shape", Kind.OPAQUE, lambda n, ins, o: [((len(_shape_slice(n, ins[0].shape)),), "int64")])
register("Size", Kind.OPAQUE, lambda n, ins, o: [((), "int64")])


def _shape_slice(node, shape):
    start, end = int(node.attrs.get("start", 0)), node.attrs.get("end")
    return tuple(shape[start:None if end is None else int(end)])


def shape_value(node, value) -> np.ndarray:
    """What Shape/Size give for an input of static shape (compile-time, input need not be constant)."""
    if node.op_type == "Size":
        return np.array(math.prod(value.shape), np.int64)
    return np.array(_shape_slice(node, value.shape), np.int64)


def _constant_value(node):
    for key in ("value", "value_float", "value_int", "value_floats", "value_ints"):
        if key in node.attrs:
            v = node.attrs[key]
            if key in ("value_float", "value_floats"):
                return np.array(v, np.float32)
            if key in ("value_int", "value_ints"):
                return np.array(v, np.int64)
            return np.asarray(v)
    raise ShapeError(f"Constant node {node.name!r}: no value attribute tunefarm reads (sparse or string values)")


def _constant_check(node, opset):
    keys = ("value", "value_float", "value_int", "value_floats", "value_ints")
    if not any(k in node.attrs for k in keys):
        return "a sparse or string constant"
    v = _constant_value(node)
    if str(v.dtype) not in ONNX_DTYPES.values():
        return f"a constant of dtype {v.dtype}"
    return None


register("Constant", Kind.OPAQUE, lambda n, ins, o: [(tuple(_constant_value(n).shape), str(_constant_value(n).dtype))],
         fold=lambda n, a, o: [_constant_value(n)], check=_constant_check)


def _cos_value(node, ins):
    shape = tuple(int(s) for s in const_input(node, ins, 0, "shape"))
    v = node.attrs.get("value")
    fill = np.zeros(1, np.float32) if v is None else np.asarray(v).reshape(-1)
    return shape, fill


register("ConstantOfShape", Kind.OPAQUE,
         lambda n, ins, o: [(_cos_value(n, ins)[0], str(_cos_value(n, ins)[1].dtype))],
         fold=lambda n, a, o: [np.full(tuple(int(s) for s in a[0]), _cos_value(n, [_ConstView(a[0])])[1][0])])


def _range_fold(node, arrays, opset):
    start, limit, delta = (a.reshape(-1)[0] for a in arrays)
    return [np.arange(start, limit, delta).astype(arrays[0].dtype)]


def _range_infer(node, ins, opset):
    """Range's length, ceil((limit - start) / delta), is its shape: all three must be known at
    compile time (they are whenever they come from shapes, which are static), and then the whole
    output is a constant."""
    for i, what in enumerate(("start", "limit", "delta")):
        v = ins[i]
        if v.const is None:
            raise ShapeError(f"Range node {node.name!r}: {what} (input {v.name!r}) is computed at run time, but "
                             "the output's length depends on start, limit and delta; tunefarm compiles static "
                             "shapes only", needs_constant=v.name)
    arrays = [v.const for v in ins[:3]]
    out = _range_fold(node, arrays, opset)[0]
    return [(out.shape, str(out.dtype))]


register("Range", Kind.OPAQUE, _range_infer, fold=_range_fold)


# ----------------------------------------------------------------------------- injective

def _gather_infer(node, ins, opset):
    data, idx = ins
    axis = axis_of(node, int(node.attrs.get("axis", 0)), len(data.shape))
    if idx.dtype not in ("int32", "int64"):
        raise ShapeError(f"Gather node {node.name!r}: indices must be int32 or int64, got {idx.dtype}")
    return [(data.shape[:axis] + idx.shape + data.shape[axis + 1:], data.dtype)]


def _gather_lower(node, xs, ins, opset):
    data, idx = xs
    axis = axis_of(node, int(node.attrs.get("axis", 0)), len(data.shape))
    q, n = len(idx.shape), data.shape[axis]
    shape = data.shape[:axis] + idx.shape + data.shape[axis + 1:]

    def read(o):
        # ONNX indices may count from the end; one outside [-n, n) stops the kernel
        i = data_index(node, idx.read(tuple(o[axis:axis + q])), n)
        return data.read(tuple(o[:axis]) + (i,) + tuple(o[axis + q:]))
    return Lazy(shape, data.dtype, read)


def _gather_fold(node, arrays, opset):
    data, idx = arrays
    axis = int(node.attrs.get("axis", 0))
    return [np.take(data, idx.astype(np.int64), axis=axis)]


register("Gather", Kind.INJECTIVE, _gather_infer, _gather_lower, _gather_fold)


def _concat_infer(node, ins, opset):
    rank = len(ins[0].shape)
    axis = axis_of(node, int(node.attrs.get("axis", 0)), rank)
    for v in ins[1:]:
        if len(v.shape) != rank or any(a != b for d, (a, b) in enumerate(zip(v.shape, ins[0].shape)) if d != axis):
            raise ShapeError(f"Concat node {node.name!r}: shapes {[x.shape for x in ins]} differ outside axis {axis}")
    shape = list(ins[0].shape)
    shape[axis] = sum(v.shape[axis] for v in ins)
    return [(tuple(shape), same_dtype(node, ins))]


def _concat_lower(node, xs, ins, opset):
    axis = axis_of(node, int(node.attrs.get("axis", 0)), len(xs[0].shape))
    offsets = np.cumsum([0] + [x.shape[axis] for x in xs]).tolist()
    shape = list(xs[0].shape)
    shape[axis] = offsets[-1]
    parts = [(x, off) for x, off in zip(xs, offsets) if x.shape[axis] > 0]

    def read(o):
        def at(x, off):
            return x.read(tuple(o[:axis]) + (o[axis] - off if off else o[axis],) + tuple(o[axis + 1:]))
        v = at(*parts[-1])
        for x, off in reversed(parts[:-1]):
            v = E.if_then_else(o[axis] < off + x.shape[axis], at(x, off), v)
        return v
    return Lazy(tuple(shape), xs[0].dtype, read)


register("Concat", Kind.INJECTIVE, _concat_infer, _concat_lower,
         lambda n, a, o: [np.concatenate(a, axis=int(n.attrs.get("axis", 0)))])


def _perm(node, rank):
    perm = ints(node, "perm") or tuple(reversed(range(rank)))
    if sorted(perm) != list(range(rank)):
        raise ShapeError(f"Transpose node {node.name!r}: perm {perm} is not a permutation of {rank} axes")
    return perm


def _transpose_lower(node, xs, ins, opset):
    x = xs[0]
    perm = _perm(node, len(x.shape))
    inv = [perm.index(d) for d in range(len(perm))]
    return Lazy(tuple(x.shape[p] for p in perm), x.dtype, lambda o: x.read(tuple(o[inv[d]] for d in range(len(perm)))))


register("Transpose", Kind.INJECTIVE,
         lambda n, ins, o: [(tuple(ins[0].shape[p] for p in _perm(n, len(ins[0].shape))), ins[0].dtype)],
         _transpose_lower, lambda n, a, o: [np.transpose(a[0], _perm(n, a[0].ndim))])


def _slice_params(node, ins, opset):
    """[(axis, start, step, length)] for the sliced axes, numpy's clamping."""
    shape = ins[0].shape
    if opset < 10:
        starts, ends = node.attrs.get("starts"), node.attrs.get("ends")
        axes, steps = node.attrs.get("axes"), None
    else:
        starts = const_input(node, ins, 1, "starts")
        ends = const_input(node, ins, 2, "ends")
        axes = const_input(node, ins, 3, "axes") if len(ins) > 3 and ins[3] is not None else None
        steps = const_input(node, ins, 4, "steps") if len(ins) > 4 and ins[4] is not None else None
    starts, ends = [int(s) for s in starts], [int(e) for e in ends]
    axes = list(range(len(starts))) if axes is None else [axis_of(node, int(a), len(shape)) for a in axes]
    steps = [1] * len(starts) if steps is None else [int(s) for s in steps]
    out = []
    for a, s, e, st in zip(axes, starts, ends, steps):
        if st == 0:
            raise ShapeError(f"Slice node {node.name!r}: step 0")
        big = 1 << 62
        sl = slice(max(min(s, big), -big), max(min(e, big), -big), st)
        rng = range(*sl.indices(shape[a]))
        out.append((a, rng.start, st, len(rng)))
    return out


def _slice_infer(node, ins, opset):
    shape = list(ins[0].shape)
    for a, _, _, n in _slice_params(node, ins, opset):
        shape[a] = n
    if 0 in shape:
        raise ShapeError(f"Slice node {node.name!r}: the slice is empty (shape {tuple(shape)})")
    return [(tuple(shape), ins[0].dtype)]


def _slice_lower(node, xs, ins, opset):
    x = xs[0]
    params = {a: (start, step) for a, start, step, _ in _slice_params(node, ins, opset)}
    shape = _slice_infer(node, ins, opset)[0][0]

    def read(o):
        return x.read(tuple(_affine(o[d], *params[d]) if d in params else o[d] for d in range(len(o))))
    return Lazy(shape, x.dtype, read)


def _affine(i, start, step):
    v = i * step if step != 1 else i
    return v + start if start else v


def _slice_fold(node, arrays, opset):

    values = [None if a is None else Value("c", tuple(a.shape), str(a.dtype), a) for a in arrays]
    sl = [slice(None)] * arrays[0].ndim
    for a, start, step, n in _slice_params(node, values, opset):
        sl[a] = slice(start, start + step * n if start + step * n >= 0 else None, step)
    return [arrays[0][tuple(sl)]]


register("Slice", Kind.INJECTIVE, _slice_infer, _slice_lower, _slice_fold)


def split_sizes(node, ins, opset) -> tuple:
    """(axis, sizes of the outputs) of a Split: the `split` attribute (opset < 13) or input, else
    equal parts (num_outputs from opset 18, else one per output; the last part may be smaller)."""
    shape = ins[0].shape
    axis = axis_of(node, int(node.attrs.get("axis", 0)), len(shape))
    if opset < 13:
        sizes = node.attrs.get("split")
    else:
        sizes = const_input(node, ins, 1, "split") if len(ins) > 1 and ins[1] is not None else None
    n = len(node.outputs)
    if sizes is None:
        parts = int(node.attrs.get("num_outputs", n))
        step = -(-shape[axis] // parts)
        sizes = [min(step, shape[axis] - i * step) for i in range(parts)]
    sizes = tuple(int(s) for s in sizes)
    if len(sizes) != n or sum(sizes) != shape[axis] or any(s < 1 for s in sizes):
        raise ShapeError(f"Split node {node.name!r}: parts {sizes} do not split {shape[axis]} into {n} outputs")
    return axis, sizes


def _split_infer(node, ins, opset):
    axis, sizes = split_sizes(node, ins, opset)
    shape = ins[0].shape
    return [(shape[:axis] + (s,) + shape[axis + 1:], ins[0].dtype) for s in sizes]


def _split_fold(node, arrays, opset):
    values = [None if a is None else Value("c", tuple(a.shape), str(a.dtype), a) for a in arrays]
    axis, sizes = split_sizes(node, values, opset)
    return np.split(arrays[0], np.cumsum(sizes)[:-1], axis=axis)


# rewritten into one Slice per output after shape inference (passes.split_to_slices), so each
# part fuses with its readers like any injective node
register("Split", Kind.INJECTIVE, _split_infer, fold=_split_fold)


def _expand_infer(node, ins, opset):
    target = tuple(int(s) for s in const_input(node, ins, 1, "shape"))
    return [(broadcast_shapes(node, ins[0].shape, target), ins[0].dtype)]


def _expand_lower(node, xs, ins, opset):
    shape = _expand_infer(node, ins, opset)[0][0]
    return Lazy(shape, xs[0].dtype, broadcast(xs[0], shape))


register("Expand", Kind.BROADCAST, _expand_infer, _expand_lower,
         lambda n, a, o: [np.broadcast_to(a[0], np.broadcast_shapes(a[0].shape, tuple(a[1]))).copy()])


def _pads(node, ins, opset):
    pads = node.attrs.get("pads") if opset < 11 else const_input(node, ins, 1, "pads")
    pads = [int(p) for p in pads]
    rank = len(ins[0].shape)
    if opset >= 18 and len(ins) > 3 and ins[3] is not None:
        raise ShapeError(f"Pad node {node.name!r}: the axes input is not supported")
    if len(pads) != 2 * rank or any(p < 0 for p in pads):
        raise ShapeError(f"Pad node {node.name!r}: pads {pads} must be 2·rank non-negative values")
    if opset < 11:
        value = float(node.attrs.get("value", 0.0))
    else:
        c = const_input(node, ins, 2, "constant_value") if len(ins) > 2 and ins[2] is not None else None
        value = 0 if c is None else c.reshape(-1)[0].item()
    return pads[:rank], pads[rank:], value


def _pad_check(node, opset):
    mode = node.attrs.get("mode", "constant")
    return None if mode == "constant" else f"mode={mode!r} (only constant padding)"


def _pad_infer(node, ins, opset):
    before, after, _ = _pads(node, ins, opset)
    return [(tuple(s + b + a for s, b, a in zip(ins[0].shape, before, after)), ins[0].dtype)]


def _pad_lower(node, xs, ins, opset):
    x = xs[0]
    before, after, value = _pads(node, ins, opset)
    shape = _pad_infer(node, ins, opset)[0][0]
    fill = E.const(value, x.dtype)

    def read(o):
        conds: list = []
        src: list = []
        for i, s, b in zip(o, x.shape, before):
            j = i - b if b else i
            if b or shape[len(src)] != s:
                conds.append((i >= b) & (i < b + s))
                j = E.minimum(E.maximum(j, 0), s - 1)
            src.append(j)
        v = x.read(tuple(src))
        if not conds:
            return v
        cond = conds[0]
        for c in conds[1:]:
            cond = cond & c
        return E.if_then_else(cond, v, fill)
    return Lazy(shape, x.dtype, read)


def _pad_fold(node, arrays, opset):

    values = [None if a is None else Value("c", tuple(a.shape), str(a.dtype), a) for a in arrays]
    before, after, value = _pads(node, values, opset)
    return [np.pad(arrays[0], list(zip(before, after)), constant_values=value)]


register("Pad", Kind.INJECTIVE, _pad_infer, _pad_lower, _pad_fold, check=_pad_check)

__all__ = ["ALIAS_TARGETS", "shape_value", "split_sizes", "dropout_mask_dtype"]
