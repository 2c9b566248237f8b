"""The scaling model (issue 58): parallel regions read from the loop IR, the profiling build's
counters, the prediction's arithmetic on hand-made regions, and `tunefarm model profile --scaling`.

Timings here are short and only checked for consistency; the arithmetic tests use made-up
per-iteration costs so they are exact."""

from __future__ import annotations

import json

import numpy as np
import pytest

import compiler as C
from compiler.codegen_llvm import CHUNKS_PER_THREAD, parallel_team_cap
from compiler.lower import lower
from compiler.parallel_regions import Region, chunk_ranges, parallel_regions
from compiler.region_clock import build_clocked
from compiler.scaling import KernelTiming, ManyCoreHost, RegionTiming, makespan, predict

ROWS, COLS = 64, 16 * 1024


def _add_one(rows=ROWS, cols=COLS):
    A = C.placeholder((rows, cols), name="A")
    out = C.compute((rows, cols), lambda i, j: A[i, j] + 1.0, name="out")
    return A, out, C.create_schedule(out)


# ----------------------------------------------------------------------------- regions from the IR

def test_one_parallel_loop_is_one_region_with_codegens_cap():
    A, out, s = _add_one()
    s[out].parallel(s[out].op.axis[0])
    func = lower(s, [A, out], "k")
    (r,) = parallel_regions(func)
    assert (r.index, r.extent, r.entries) == (0, ROWS, 1)
    assert r.team_cap == parallel_team_cap(r.loop) == ROWS   # 16K elements a row: one thread a row
    assert r.bytes == 2 * ROWS * COLS * 4 and r.buffers == ["A", "out"]


def test_a_gather_moves_the_rows_it_reads_not_its_table():
    """The bandwidth bound counts what a region can reach: 8 rows of a 25.6 MB table, not the table."""
    T = C.placeholder((100_000, 64), name="T")
    idx = C.placeholder((8,), "int32", "idx")
    out = C.compute((8, 64), lambda i, j: T[idx[i], j], name="out")
    s = C.create_schedule(out)
    s[out].parallel(s[out].op.axis[0])
    (r,) = parallel_regions(lower(s, [T, idx, out], "k"))
    rows = 8 * 64 * 4
    assert 2 * rows <= r.bytes <= 2 * rows + idx.op.shape[0] * 4 * 64


def test_parallel_loop_under_a_serial_loop_forks_once_per_outer_iteration():
    A, out, s = _add_one()
    jo, ji = s[out].split(s[out].op.axis[1], factor=1024)
    s[out].reorder(jo, s[out].op.axis[0], ji)
    s[out].parallel(s[out].op.axis[0])
    (r,) = parallel_regions(lower(s, [A, out], "k"))
    assert r.extent == ROWS and r.entries == COLS // 1024


def test_serial_kernel_and_nested_parallel_loops():
    A, out, s = _add_one()
    assert parallel_regions(lower(s, [A, out], "k")) == []
    A, out, s = _add_one()
    s[out].parallel(s[out].op.axis[0])
    s[out].parallel(s[out].op.axis[1])   # inside a region: runs serially in its chunk
    assert len(parallel_regions(lower(s, [A, out], "k"))) == 1


def test_chunks_follow_the_generated_rule():
    assert chunk_ranges(448, 16) == [(i, min(i + 7, 448)) for i in range(0, 448, 7)]   # ceil(448 / 64) = 7
    assert len(chunk_ranges(32, 16)) == 32 and len(chunk_ranges(3, 16)) == 3
    assert chunk_ranges(10, 1) == [(0, 3), (3, 6), (6, 9), (9, 10)]
    assert CHUNKS_PER_THREAD == 4


def test_profiling_build_counts_every_iteration_and_entry():
    A, out, s = _add_one(rows=8, cols=4096)
    jo, ji = s[out].split(s[out].op.axis[1], factor=1024)
    s[out].reorder(jo, s[out].op.axis[0], ji)
    s[out].parallel(s[out].op.axis[0])
    clocked = build_clocked(s, [A, out])
    a = np.random.default_rng(0).standard_normal((8, 4096)).astype(np.float32)
    o = np.zeros_like(a)
    clocked.kernel(a, o)
    np.testing.assert_allclose(o, a + 1.0)          # the instrumented kernel still computes
    assert clocked.clock.entries(0) == 4             # forked once per outer iteration
    ticks = clocked.clock.iteration_ticks(0)
    assert ticks.shape == (8,) and (ticks > 0).all()
    assert clocked.clock.span_ticks(0) >= ticks.sum()


# ----------------------------------------------------------------------------- the arithmetic

def _region(extent, cap=1 << 20, entries=1, nbytes=0, index=0):
    return Region(index, "i", extent, min(cap, extent), entries, nbytes)


def _timing(regions, serial=0.0):
    compute = sum(float(rt.iteration_seconds.sum()) for rt in regions)
    for rt in regions:
        rt.span_seconds = float(rt.iteration_seconds.sum())
    return KernelTiming("k", serial + compute, regions)


NO_FORK = lambda team: 0.0   # noqa: E731


def test_three_chunks_never_go_more_than_three_times_faster():
    kt = _timing([RegionTiming(_region(3), np.full(3, 1e-3), 1)])
    for n in (4, 16, 128):
        p = predict(kt, n, NO_FORK)
        assert p.speedup == pytest.approx(3.0)
        assert "team cap" in p.limit() or "chunks" in p.limit()


def test_makespan_is_the_ceil_of_chunks_over_threads():
    costs = np.ones(10)
    assert makespan(costs, chunk_ranges(10, 4), 4) == 3.0     # 10 chunks of 1 on 4 threads: ceil(10 / 4)
    assert makespan(costs, chunk_ranges(10, 1), 1) == 10.0    # one thread does it all
    uneven = np.array([8.0, 1, 1, 1, 1, 1, 1, 1, 1])
    assert makespan(uneven, [(i, i + 1) for i in range(9)], 2) == 8.0   # one slow iteration bounds it


def test_serial_part_is_amdahl():
    kt = _timing([RegionTiming(_region(1 << 12), np.full(1 << 12, 1e-6), 1)], serial=4.096e-3)
    p = predict(kt, 16, NO_FORK)
    assert p.speedup == pytest.approx(2 / (1 + 1 / 16), rel=1e-6)
    assert p.limit() == "serial"


def test_fork_join_dominates_a_tiny_kernel():
    kt = _timing([RegionTiming(_region(64, entries=3), np.full(64, 1e-8), 3)])
    fork = lambda team: 0.3e-6 + 0.2e-6 * (team - 1)   # noqa: E731
    p = predict(kt, 16, fork)
    assert p.speedup < 1.0 and p.limit().startswith("fork/join")
    assert p.losses["fork/join"] == pytest.approx(3 * fork(16))


def test_bandwidth_bound_applies_past_the_teams_caches():
    host = ManyCoreHost(gbps_per_core=5.0, l2_bytes_per_core=1 << 20)
    big = 64 << 20   # 64 MiB: beyond 16 MiB of L2
    kt = _timing([RegionTiming(_region(4096, nbytes=big), np.full(4096, 1e-6), 1)])
    p = predict(kt, 16, NO_FORK, host)
    assert p.seconds == pytest.approx(big / (16 * 5e9))
    assert p.limit().startswith("bandwidth")
    small = _timing([RegionTiming(_region(4096, nbytes=8 << 20), np.full(4096, 1e-6), 1)])
    assert predict(small, 16, NO_FORK, host).speedup == pytest.approx(16.0)


# ----------------------------------------------------------------------------- the profile and the CLI

@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    from test_graph_profile import small_cnn
    path = tmp_path_factory.mktemp("scaling") / "cnn.onnx"
    path.write_bytes(small_cnn().SerializeToString())
    return path


def test_cli_profile_shows_chunks_and_predicted_efficiency(model_file, capsys):
    from tuner.cli import main
    args = ["model", "profile", str(model_file), "--no-records", "--repeat", "3", "--scaling"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "chunks@16" in out and "eff16" in out and "predicted" in out and "fork/join" in out
    assert main([*args, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert 0 < data["scaling"]["predicted_efficiency"] <= 1.0
    for k in data["kernels"]:
        s = k["scaling"]
        assert s["threads"] == 16 and len(s["chunks"]) == s["regions"] and 0 < s["predicted_efficiency"] <= 1.0


def test_a_model_whose_first_kernel_reads_an_input_is_measured_on_that_input():
    """A run reads its inputs where the caller keeps them, so the module's own input buffers held
    garbage: a Gather's indices there failed their check (BERT and Llama were refused)."""
    from graph_models import model
    from onnx import helper

    from compiler.graph import build_model, from_onnx
    from compiler.graph.model_scaling import measure_model_scaling
    from compiler.parallel_probe import ParallelCosts

    table = np.random.default_rng(0).standard_normal((50, 16)).astype(np.float32)
    m = model([helper.make_node("Gather", ["table", "ids"], ["g"]), helper.make_node("Relu", ["g"], ["y"])],
              {"ids": ((64,), "int64")}, {"y": (None, "float32")}, {"table": table}, opset=17)
    module = build_model(from_onnx(m))
    ids = np.random.default_rng(1).integers(0, 50, 64)
    costs = ParallelCosts(1e9, 0.0, {1: 1e-6, 2: 2e-6}, 2, {1: 0.2e-6, 2: 0.4e-6})
    sc = measure_model_scaling(module, {"ids": ids}, costs=costs, threads=(4, 16))
    assert sc.kernels and 0 < sc.efficiency(16) <= 1.0
