"""The differential fuzzer (tests/kernel_fuzz.py) as an always-on guard.

A fixed range of seeds must give no finding: no wrong result, crash, hang or non-CompilerError
exception. Reproduce a failing seed with `bench/fuzz.py --seed N --verbose`; run more seeds with
`bench/fuzz.py --seeds N`. The checker itself must notice a wrong result, a crash and a hang, or
the guard could pass by seeing nothing.
"""

from __future__ import annotations

import numpy as np
from kernel_fuzz import Worker, compare, describe, make_case, run_seeds

SEEDS = range(0, 160)  # about 20 s with two workers on this 2-core machine


def test_fuzz_seeds_give_no_findings():
    results = run_seeds(SEEDS, jobs=2)
    findings = [r.line() for r in results if r.is_finding]
    assert not findings, (f"{len(findings)} findings (reproduce one with bench/fuzz.py --seed N --verbose):\n"
                          + "\n".join(findings))
    assert {r.generator for r in results} == {"inventory", "compute"}
    ran = sum(r.outcome == "ok" for r in results)
    assert ran >= 0.8 * len(results), f"only {ran} of {len(results)} cases ran: the generators draw too many rejects"


def test_the_checker_reports_wrong_results_crashes_hangs_and_exceptions():
    with Worker(timeout=4) as w:
        assert w.run(0, fault="none").outcome == "ok"
        wrong = w.run(0, fault="wrong")
        assert wrong.outcome == "wrong" and "beyond rtol" in wrong.message
        crash = w.run(0, fault="crash")
        assert crash.outcome == "crash" and "SIGSEGV" in crash.message and crash.phase == "run"
        hang = w.run(0, fault="hang")
        assert hang.outcome == "hang" and hang.phase == "build"
        exc = w.run(0, fault="exception")
        assert exc.outcome == "exception" and "RuntimeError: injected fault" in exc.message
        assert w.run(0, fault="none").outcome == "ok"  # a fresh worker after the crash and the hang


def test_a_seed_always_draws_the_same_case():
    for seed in (3, 4, 1234):
        assert make_case(seed).title == make_case(seed).title
        assert describe(seed) == describe(seed)
    assert len({make_case(s).title for s in range(20)}) == 20


def test_compare_needs_nan_inf_in_place_and_exact_integers():
    ref = np.array([1.0, np.nan, np.inf, -2.0])
    assert compare(ref.astype("float32"), ref, "float32") == ""
    assert compare(np.array([1.00001, np.nan, np.inf, -2.0], "float32"), ref, "float32") == ""
    for got in ([1.0, 0.0, np.inf, -2.0], [1.0, np.nan, 1e30, -2.0], [1.0, np.nan, np.inf, -2.01]):
        assert compare(np.array(got, "float32"), ref, "float32")
    assert compare(np.array([1.0 + 1e-7], "float64"), np.array([1.0]), "float64")
    assert compare(np.array([1.0 + 1e-7], "float64"), np.array([1.0]), "float64", precision="float32") == ""
    assert compare(np.array([3, 4], "int8"), np.array([3, 5], "int8"), "int8")
