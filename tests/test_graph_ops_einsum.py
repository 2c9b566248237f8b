"""Einsum against numpy's einsum in float64, on random non-zero inputs of odd shapes: the forms
transformers write become MatMul (canonical_ops.einsum_to_matmul), the others run as one
reduction compute; equations that do not fit their operands are refused with a reason."""

from __future__ import annotations

import numpy as np
import pytest
from graph_models import assert_close, model, rand, run
from onnx import helper

from compiler.graph import from_onnx
from compiler.graph.errors import ShapeError

RNG = np.random.default_rng(21)


def einsum_model(eq, shapes, const=(), dtype="float32"):
    """Operands x0, x1, ...; those whose positions are in `const` are initializers."""
    names = [f"x{i}" for i in range(len(shapes))]
    arrays = [rand(RNG, s, dtype) if dtype.startswith("float") else RNG.integers(-4, 5, s).astype(dtype)
              for s in shapes]
    want = np.einsum(eq.replace(" ", ""), *[a.astype(np.float64) for a in arrays])
    node = helper.make_node("Einsum", names, ["y"], equation=eq)
    inputs = {n: (s, dtype) for i, (n, s) in enumerate(zip(names, shapes)) if i not in const}
    inits = {n: a for i, (n, a) in enumerate(zip(names, arrays)) if i in const}
    m = model([node], inputs, {"y": (want.shape, dtype)}, inits, opset=12)
    feeds = {n: a for i, (n, a) in enumerate(zip(names, arrays)) if i not in const}
    return m, feeds, want


MATMUL_FORMS = [
    ("bhid,bhjd->bhij", [(2, 3, 5, 7), (2, 3, 6, 7)], ()),     # attention scores: q · kᵀ
    ("bhij,bhjd->bhid", [(2, 3, 5, 6), (2, 3, 6, 7)], ()),     # attention · v
    ("bij,bjk->bik", [(3, 5, 7), (3, 7, 4)], ()),
    ("ij,jk->ik", [(5, 7), (7, 9)], ()),
    ("bid,jd->bij", [(2, 5, 7), (9, 7)], (1,)),                # a linear layer with its [out, in] weight
    ("bqhd,bkhd->bhqk", [(2, 5, 3, 4), (2, 6, 3, 4)], ()),     # heads in the third axis
    ("ij,jk", [(4, 5), (5, 3)], ()),                            # implicit output: ik
    ("ijk,jil->kl", [(3, 4, 5), (4, 3, 2)], ()),               # two labels summed, both operands transposed
    ("bij,bj->bi", [(2, 5, 7), (2, 7)], ()),                   # matrix · vector
    ("ij,jk->ki", [(4, 5), (5, 3)], ()),                       # the product transposed after
    ("bhij,bjhd->bihd", [(2, 3, 4, 5), (2, 5, 3, 6)], ()),     # heads moved back beside the features
]


@pytest.mark.parametrize("eq,shapes,const", MATMUL_FORMS, ids=[f[0] for f in MATMUL_FORMS])
def test_matrix_product_forms_become_matmul(eq, shapes, const):
    m, feeds, want = einsum_model(eq, shapes, const)
    ops = [n.op_type for n in from_onnx(m).nodes]
    assert "MatMul" in ops and "Einsum" not in ops, ops
    if const:
        assert "Transpose" not in ops    # the constant weight was transposed at compile time
    (y,) = run(m, feeds)
    assert_close(y, want)


OTHER_FORMS = [
    ("ii->i", [(5, 5)]),                        # diagonal
    ("...ii->...i", [(3, 4, 4)]),               # batched diagonal
    ("ij->", [(3, 7)]),                         # total
    ("ij->i", [(3, 7)]),
    ("ij->ji", [(3, 7)]),
    ("i,i", [(7,), (7,)]),                      # inner product to a scalar
    ("i,j->ij", [(3,), (5,)]),                  # outer product: nothing summed
    ("ij,ij->ij", [(3, 5), (3, 5)]),
    ("ij,jk,kl->il", [(3, 4), (4, 5), (5, 2)]),
    ("bij,bjk->bk", [(2, 3, 4), (2, 4, 5)]),    # i summed over one operand only
    ("...ij,...jk->...ik", [(2, 3, 4), (4, 5)]),  # ellipsis broadcast
    ("bi,bi->b", [(1, 5), (4, 5)]),             # a size-1 axis broadcast against 4
]


@pytest.mark.parametrize("eq,shapes", OTHER_FORMS, ids=[f[0] for f in OTHER_FORMS])
def test_other_forms_run_as_one_reduction(eq, shapes):
    m, feeds, want = einsum_model(eq, shapes)
    (y,) = run(m, feeds)
    assert_close(y.reshape(want.shape), want)


def test_integer_einsum():
    m, feeds, want = einsum_model("ij,jk->ik", [(3, 4), (4, 2)], dtype="int64")
    (y,) = run(m, feeds)
    assert y.tolist() == want.astype(np.int64).tolist()


@pytest.mark.parametrize("eq,shapes,match", [
    ("ij,jk->il", [(2, 3), (3, 4)], "appear in no operand"),
    ("ij,jk->ik", [(2, 3), (4, 4)], "sizes 3 and 4"),
    ("ijk->ij", [(2, 3)], "does not match its labels"),
    ("ij->ii", [(2, 2)], "repeats in the output"),
    ("i1->i", [(2, 3)], "letters"),
    ("ij->...ij", [(2, 3)], r"'\.\.\.' in the output"),
])
def test_bad_equations_are_refused_with_a_reason(eq, shapes, match):
    node = helper.make_node("Einsum", [f"x{i}" for i in range(len(shapes))], ["y"], equation=eq)
    m = model([node], {f"x{i}": (s, "float32") for i, s in enumerate(shapes)}, {"y": (None, "float32")}, opset=12)
    with pytest.raises(ShapeError, match=match):
        from_onnx(m)
