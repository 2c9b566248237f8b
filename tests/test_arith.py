"""Index simplification: what turns packed-layout indices back into unit-stride accesses."""

from compiler import arith
from compiler.expr import Const, Var
from compiler.loop_ir import format_expr


def test_floordiv_and_mod_of_a_split_index_simplify_to_the_loops():
    jo, ji = Var("jo"), Var("ji")
    ranges = {jo: (0, 63), ji: (0, 15)}
    j = jo * 16 + ji
    assert format_expr(arith.simplify(j // 16, ranges)) == "jo"
    assert format_expr(arith.simplify(j % 16, ranges)) == "ji"


def test_divmod_keeps_what_the_ranges_cannot_decide():
    x = Var("x")
    e = arith.simplify(x // 4, {x: (0, 10)})
    assert "//" in format_expr(e)
    assert arith.simplify((x * 8 + 3) // 4, {x: (0, 10)}) is not None
    assert format_expr(arith.simplify((x * 8 + 3) // 4, {x: (0, 10)})) == "(x * 2)"


def test_a_split_and_joined_index_is_the_index_whatever_its_sign():
    """(k // 16) * 16 + k % 16 is k under floor division even where k may be negative (a concat's
    part read through a layout copy, k = c - 24): joined back, a guard on k bounds it."""
    c = Var("c")
    ranges = {c: (0, 63)}
    k = c - 24
    assert format_expr(arith.simplify((k // 16) * 16 + k % 16, ranges)) == "(c - 24)"
    assert format_expr(arith.simplify(((k // 16) * 16 + k % 16) * 3, ranges)) == "((c * 3) - 72)"
    assert "//" in format_expr(arith.simplify((k // 16) * 32 + k % 16, ranges))   # not a join: kept
    assert "//" in format_expr(arith.simplify((k // 16) * 16 + (k + 1) % 16, ranges))


def test_linear_terms_collect_and_cancel():
    i, k = Var("i"), Var("k")
    e = (i * 32 + k) - (k - 5) + i * 2
    assert format_expr(arith.simplify(e, {})) == "((i * 34) + 5)"


def test_comparisons_decided_by_ranges():
    i = Var("i")
    r = {i: (0, 5)}
    assert isinstance(arith.simplify(i < 6, r), Const) and arith.simplify(i < 6, r).value is True
    assert arith.simplify(i >= 6, r).value is False
    assert not isinstance(arith.simplify(i < 5, r), Const)
    assert arith.prove((i * 2 + 1) < 12, r)


def test_min_max_pick_a_side_when_ranges_allow():
    i = Var("i")
    r = {i: (0, 9)}
    from compiler.expr import maximum, minimum
    assert format_expr(arith.simplify(minimum(i, 100), r)) == "i"
    assert format_expr(arith.simplify(maximum(i, 0), r)) == "i"
    assert "min" in format_expr(arith.simplify(minimum(i, 5), r))


def test_bound_relaxes_inner_loops_and_keeps_outer_symbolic():
    io, ii = Var("io"), Var("ii")
    lo, hi = arith.bound(io * 6 + ii, {ii: (0, 5)}, {io: (0, 10)})
    ext = hi.add(lo, -1)
    assert ext.is_const() and ext.const == 5
    assert format_expr(arith.from_lin(lo)) == "(io * 6)"
