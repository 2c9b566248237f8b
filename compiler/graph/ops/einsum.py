"""Einsum: the equation parsed once into labelled axes, lowered as one reduction compute.

Transformers write attention as Einsum ("bhid,bhjd->bhij", "bhij,bhjd->bhid") and linear
layers as "bid,jd->bij". An Einsum that is a (batched) matrix product up to transposes is
rewritten into Transpose / Reshape / MatMul nodes before fusion (canonical_ops.einsum_to_matmul),
so it gets the GEMM schedules and fuses its epilogue; any other form (a trace, a diagonal, a
sum over one operand's axis, more than two operands) is lowered here directly: the output's
labels are its axes, every other label is a reduction axis, and the body is the product of the
operands' reads (`EinsumSpec.compute`).

The equation follows numpy: letters label axes, a letter repeated within one operand takes a
diagonal, "..." stands for the leading axes an operand has beyond its letters (broadcast across
operands, right-aligned), and without "->" the output is the ellipsis followed by the letters
used once, in alphabetical order.
"""

from __future__ import annotations

import string
from dataclasses import dataclass

import numpy as np

from ...tensor import compute, reduce_axis
from ...tensor import sum as te_sum
from ..errors import ShapeError
from .base import Kind, Lazy, materialize, register

ELLIPSIS = "..."


@dataclass(frozen=True)
class EinsumSpec:
    """An equation bound to operand shapes: each operand's labels (one per axis), the output's
    labels, and every label's size. Ellipsis axes get labels "0", "1", ... (right-aligned)."""

    inputs: tuple     # tuple of label tuples, one per operand
    output: tuple     # label tuple
    sizes: dict       # label -> size

    @property
    def reduced(self) -> tuple:
        """Labels summed over (in no output), in order of first appearance."""
        seen: list = []
        for labels in self.inputs:
            for lab in labels:
                if lab not in self.output and lab not in seen:
                    seen.append(lab)
        return tuple(seen)

    @property
    def shape(self) -> tuple:
        return tuple(self.sizes[lab] for lab in self.output)

    def compute(self, operands: list, name: str = "einsum"):
        """The output as one compute stage: a sum over the reduced labels of the product of the
        operands' reads (a size-1 axis broadcast against a larger one reads index 0)."""
        raxes = {lab: reduce_axis(self.sizes[lab], f"r_{lab}") for lab in self.reduced}
        shapes = [t.shape for t in operands]

        def product(var):
            acc = None
            for t, labels, shape in zip(operands, self.inputs, shapes):
                idx = tuple(0 if s == 1 and self.sizes[lab] != 1 else var[lab] for lab, s in zip(labels, shape))
                v = t[idx] if idx else t[(0,)]
                acc = v if acc is None else acc * v
            return acc

        def body(*idx):
            var = dict(zip(self.output, idx))
            var.update({lab: r.var for lab, r in raxes.items()})
            p = product(var)
            return te_sum(p, axis=list(raxes.values())) if raxes else p
        shape = self.shape or (1,)
        if not self.output:   # a 0-d result: computed as one element
            return compute(shape, lambda i: body(), name=name, tag="einsum")
        return compute(shape, body, name=name, tag="einsum")


def parse(node, shapes) -> EinsumSpec:
    """The node's equation bound to its operands' shapes; ShapeError when they disagree."""
    eq = str(node.attrs.get("equation", "")).replace(" ", "")
    where = f"Einsum node {node.name!r}: equation {eq!r}"
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(shapes):
        raise ShapeError(f"{where} has {len(terms)} operand(s), the node {len(shapes)}")
    allowed = set(string.ascii_letters)
    split_terms: list[tuple[list[str], bool, list[str]]] = []   # (letters before '...', '...'?, after)
    for term in terms + ([rhs] if arrow else []):
        if term.count(ELLIPSIS) > 1 or any(c not in allowed for c in term.replace(ELLIPSIS, "")):
            raise ShapeError(f"{where}: {term!r} is not letters with at most one '...'")
        before, dots, after = term.partition(ELLIPSIS)
        split_terms.append((list(before), bool(dots), list(after)))
    # the ellipsis: as many axes as each operand has beyond its letters, right-aligned
    n_ell = 0
    for (head, has_dots, tail), shape in zip(split_terms, shapes):
        extra = len(shape) - len(head) - len(tail)
        if extra < 0 or (extra and not has_dots):
            raise ShapeError(f"{where}: an operand of rank {len(shape)} does not match its labels")
        n_ell = max(n_ell, extra)
    ell = [str(d) for d in range(n_ell)]
    inputs: list[tuple[str, ...]] = []
    sizes: dict[str, int] = {}
    for (head, _, tail), shape in zip(split_terms, shapes):
        extra = len(shape) - len(head) - len(tail)
        labels = head + ell[n_ell - extra:] + tail
        for lab, s in zip(labels, shape):
            if sizes.get(lab, 1) != 1 and s != 1 and sizes[lab] != s:
                raise ShapeError(f"{where}: label {_show(lab)} has sizes {sizes[lab]} and {s}")
            if lab not in sizes or sizes[lab] == 1:
                sizes[lab] = int(s)
        inputs.append(tuple(labels))
    output: list[str]
    if arrow:
        out_head, out_dots, out_tail = split_terms[-1]
        if out_dots and not any(d for _, d, _ in split_terms[:-1]):
            raise ShapeError(f"{where}: '...' in the output but in no operand")
        output = out_head + (ell if out_dots else []) + out_tail   # ellipsis axes left out are summed, as numpy does
        if len(set(output)) != len(output):
            raise ShapeError(f"{where}: a label repeats in the output")
        missing = [lab for lab in output if lab not in sizes]
        if missing:
            raise ShapeError(f"{where}: output label(s) {', '.join(missing)} appear in no operand")
    else:
        counts: dict[str, int] = {}
        for used in inputs:
            for lab in used:
                counts[lab] = counts.get(lab, 0) + 1
        output = ell + sorted(lab for lab, c in counts.items() if c == 1 and lab not in ell)
    return EinsumSpec(tuple(inputs), tuple(output), sizes)


def _show(label: str) -> str:
    return f"'...' axis {label}" if label.isdigit() else repr(label)


def _infer(node, ins, opset):
    if not ins or any(v is None for v in ins):
        raise ShapeError(f"Einsum node {node.name!r}: needs at least one operand and no omitted ones")
    dtypes = {v.dtype for v in ins}
    if len(dtypes) != 1 or "bool" in dtypes:
        raise ShapeError(f"Einsum node {node.name!r}: operands of one numeric dtype, got {sorted(dtypes)}")
    spec = parse(node, [v.shape for v in ins])
    return [(spec.shape, ins[0].dtype)]


def _check(node, opset):
    if not node.attrs.get("equation"):
        return "no equation attribute"
    return None


def _lower(node, xs, ins, opset):
    spec = parse(node, [x.shape for x in xs])
    operands = [materialize(x, f"operand{i}") for i, x in enumerate(xs)]
    out = spec.compute(operands)
    if not spec.output:
        return Lazy((), out.dtype, lambda idx: out[(0,)])
    return Lazy.of(out)


def _fold(node, arrays, opset):
    eq = str(node.attrs["equation"]).replace(" ", "")
    return [np.asarray(np.einsum(eq, *arrays)).astype(arrays[0].dtype)]


register("Einsum", Kind.OPAQUE, _infer, _lower, _fold, check=_check, min_opset=12)


__all__ = ["EinsumSpec", "parse"]
