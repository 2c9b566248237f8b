"""LLVM IR generation from the loop IR, with llvmlite.ir.

- A `vectorized` loop is emitted once with its variable standing for all lanes: unit-stride
  loads/stores become vector loads/stores, other accesses gathers/scatters, guards that depend on
  the lane become masks (masked loads/stores), uniform values stay scalar and are broadcast.
- An `unrolled` loop is emitted once per iteration with its variable a constant.
- A `parallel` loop is outlined into a function run by libgomp's GOMP_parallel, each thread taking
  contiguous chunks of iterations as it comes free (a dynamic schedule, about CHUNKS_PER_THREAD
  chunks a thread, each claimed by an atomic add on the loop's own counter rather than through
  libgomp's work-sharing loop, whose start and end took a fifth of a fork/join on 2 threads:
  bench/chunk_claims.py). Its team is sized to the work, not the
  cores: at most one thread per iteration and per MIN_WORK_PER_THREAD elements its body stores
  (vector lanes counted; a reduction's accumulator updates at a quarter), at most
  omp_get_max_threads(). A kernel of a few microseconds on 16 cores otherwise spent longer
  starting and joining 16 threads than computing (a batch-1 MLP ran 0.53x onnxruntime on a
  16-core Xeon; onnxruntime's GEMM takes one thread per 64K multiply-adds).
- Kernel arguments are `noalias`; scratch buffers are 64-byte aligned.
- Scratch buffers are allocated once per function, at its entry (the kernel, or each thread's
  outlined chunk), however often the loop that declares them runs or is unrolled: small ones on
  the stack while the function's stack budget lasts (LLVM keeps a register tile's buffer in
  registers), the rest on the heap, checked. The kernel's own heap buffers are kept between
  calls, each in a slot of its own, taken and given back by atomic exchange, so concurrent
  calls stay correct: allocated and freed on every call, a Winograd convolution's 3 MB of
  transformed tiles came back from glibc as fresh pages each time, and the page faults took 3x
  the kernel's arithmetic (res2's 3x3 ran 65 GFLOPS-equivalent instead of 302). A thread's
  chunk still allocates and frees its own: kept per thread number, the same direct
  convolutions ran at either of two speeds from one process to the next (res4's 3x3/2: 101,
  144 or 207 GFLOPS; per call, 190-209). The module's `<kernel>_release` frees what the slots
  hold (the runtime calls it when a Kernel is collected).
- Status: the kernel returns KERNEL_OK or a bit set of failures, after freeing what it holds:
  KERNEL_OUT_OF_MEMORY when a heap allocation failed in it or any of its threads,
  KERNEL_INDEX_OUT_OF_RANGE when a data-dependent index (expr.CheckedIndex) left its range.
  Every kernel takes one argument after its buffers, the caller's error record (int64[2], may be
  NULL; compiler/index_checks.py), where the first check to fire leaves its number and value.
- A check is one unsigned compare of `value - lo` against `hi - lo` and a branch, weighted
  unlikely, to a cold block that records and exits; in a vector loop the lanes' compares
  (masked by the loop's current mask) are or-reduced into one branch. In a parallel loop the
  failing thread ends its share of the loop and ors the status into the kernel's status word;
  the other threads stop at their next chunk.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from llvmlite import ir

from . import arith
from .expr import Binary, Call, Cast, CheckedIndex, Compare, Const, Expr, Logical, Not, Select, Var, transform, walk
from .index_checks import IndexCheck, collect_checks
from .loop_ir import Allocate, Buffer, For, IfThenElse, LetStmt, Load, LoweredFunc, Prefetch, Seq, Stmt, Store, stmt_exprs, walk_stmts
from .parallel_teams import Team, team_plan

I1, I8, I32, I64 = ir.IntType(1), ir.IntType(8), ir.IntType(32), ir.IntType(64)
F32, F64 = ir.FloatType(), ir.DoubleType()
PTR = ir.PointerType()
RELEASE_SUFFIX = "_release"   # `<kernel>_release()` frees the kept scratch buffers
LLTYPE = {"float32": F32, "float64": F64, "int8": I8, "int32": I32, "int64": I64, "bool": I1}
# in memory a bool is one byte (numpy's layout): a <N x i1> vector load/store would be bit-packed
MEMTYPE = dict(LLTYPE, bool=I8)
STACK_LIMIT_BYTES = 32 * 1024    # largest buffer placed on the stack
STACK_BUDGET_BYTES = 128 * 1024  # all stack buffers of one function (thread stacks are >= 2 MiB)
FAST = ("contract",)
KERNEL_OK = 0
# stored elements (vector lanes counted) a parallel loop gives each thread at least: half the
# work at which the default schedules go parallel (ops.schedule_common.PARALLEL_MIN_WORK), so a
# loop they make parallel runs on two threads
MIN_WORK_PER_THREAD = 1 << 14
ACCUMULATE_WORK = 0.25   # an accumulator update's share of MIN_WORK_PER_THREAD against a stored element's
# a stored element whose value is gathered across the vector's lanes (a channel shuffle, a layout
# change across channel blocks) against a contiguous one: znver4, 26656 float32 elements of
# ShuffleNet's shuffle 0.73 ns each, copied in order 0.12 ns each
GATHER_WORK = 6.0
KERNEL_OUT_OF_MEMORY = 1
KERNEL_INDEX_OUT_OF_RANGE = 2

_ICMP = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}


def _mangle(t) -> str:
    if isinstance(t, ir.VectorType):
        return f"v{t.count}{_mangle(t.element)}"
    if t == F32:
        return "f32"
    if t == F64:
        return "f64"
    if isinstance(t, ir.IntType):
        return f"i{t.width}"
    return "p0"


class ModuleBuilder:
    """One LLVM module holding a kernel and the functions outlined from its parallel loops."""

    def __init__(self, func: LoweredFunc, target, index_checks: bool = True, region_clock=None, teams: bool = True):
        """`index_checks=False` clamps data-dependent indices into their range instead of
        checking them: only for measuring what the checks cost (bench/index_checks.py).
        `region_clock`: a profiling build (compiler/region_clock.py) whose parallel loops read
        the cycle counter around their fork/join and each iteration; None in every real build.
        `teams=False`: every parallel loop forks its own team (compiler/parallel_teams.py), only
        for measuring what one team saves (bench/parallel_teams.py)."""
        self.func = func
        self.teams = teams
        self.region_clock = region_clock
        self.target = target
        self.module = ir.Module(name=func.name)
        self.module.triple = target.triple
        self.n_outlined = 0
        self.scratch_slots: list = []   # the i64 global of every kept heap scratch buffer
        self.index_checks = index_checks
        self.checks: list = collect_checks(func) if index_checks else []   # IndexCheck by number

    def check_number(self, e: CheckedIndex) -> int:
        """The number the kernel reports for check `e` (its position in `checks`)."""
        check = IndexCheck.of(e)
        if check not in self.checks:
            self.checks.append(check)
        return self.checks.index(check)

    def declare(self, name: str, ret, args, varargs=False):
        fn = self.module.globals.get(name)
        if fn is None:
            fn = ir.Function(self.module, ir.FunctionType(ret, args, var_arg=varargs), name=name)
        return fn

    def intrinsic(self, base: str, ret, args, types):
        name = base + "".join("." + _mangle(t) for t in types)
        return self.declare(name, ret, args)

    def build(self) -> ir.Module:
        f = self.func
        fnty = ir.FunctionType(I32, [PTR] * (len(f.args) + 1))   # the buffers, the error record
        fn = ir.Function(self.module, fnty, name=f.name)
        for a in fn.args:
            a.add_attribute("noalias")
        em = FunctionEmitter(self, fn)
        for buf, arg in zip(f.args, fn.args):
            em.buffers[buf] = arg
        em.error_ptr = fn.args[-1]
        if self.checks:
            _clear_error_record(em.builder, em.error_ptr)
        started = self.region_clock.start(em, None) if self.region_clock is not None else None
        em.emit_stmt(f.body)
        if self.region_clock is not None:
            self.region_clock.end_call(em, started)
        em.finish()
        self._emit_release(f.name + RELEASE_SUFFIX)
        return self.module

    def scratch_slot(self, name: str):
        """A module global, a null pointer (as i64) at first, in which one heap scratch buffer
        is kept between calls."""
        slot = ir.GlobalVariable(self.module, I64, name=f"scratch.{name}")
        slot.linkage = "internal"
        slot.initializer = ir.Constant(I64, 0)
        self.scratch_slots.append(slot)
        return slot

    def _emit_release(self, name: str):
        """`void <kernel>_release(void)`: every kept scratch buffer freed, its slot emptied."""
        fn = ir.Function(self.module, ir.FunctionType(ir.VoidType(), []), name=name)
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        free = self.declare("free", ir.VoidType(), [PTR])
        for slot in self.scratch_slots:
            held = b.atomic_rmw("xchg", slot, ir.Constant(I64, 0), "acq_rel")
            b.call(free, [b.inttoptr(held, PTR)])
        b.ret_void()


def _clear_error_record(b, record):
    """record[0] = 0 where the caller passed a record: no check has fired yet."""
    with b.if_then(b.icmp_unsigned("!=", record, ir.Constant(PTR, None))):
        b.store(ir.Constant(I64, 0), record)


class _Outlined:
    """A parallel loop's outlined body: the function, its closure and the emitter filling it."""

    def __init__(self, fn, struct_t, closure, child, first_buffer: int, n_buffers: int, first_extra: int):
        self.fn, self.struct_t, self.closure, self.child = fn, struct_t, closure, child
        self.first_buffer, self.n_buffers, self.first_extra = first_buffer, n_buffers, first_extra

    def call(self, b, closure):
        """Call the body from a thread's entry: the captured buffer pointers loaded from the
        closure and passed as `noalias` arguments. Loaded inside the body they would carry no
        aliasing facts (an outlined loop is a different function from the kernel whose arguments
        are noalias), and LLVM would keep every accumulator that lives in an output buffer in
        memory: a max pool's 9 taps per vector went through store-to-load forwarding, 2.2x
        slower."""
        ptrs = [b.load(b.gep(closure, [ir.Constant(I32, 0), ir.Constant(I32, self.first_buffer + j)],
                             source_etype=self.struct_t), typ=PTR) for j in range(self.n_buffers)]
        b.call(self.fn, [closure, *ptrs])

    def extra(self, i: int):
        """The body's `i`-th extra closure pointer (loaded in its entry)."""
        b = self.child.heap_builder
        return b.load(b.gep(self.fn.args[0], [ir.Constant(I32, 0), ir.Constant(I32, self.first_extra + i)],
                            source_etype=self.struct_t), typ=PTR)


class FunctionEmitter:
    """Emits statements into one LLVM function."""

    def __init__(self, mb: ModuleBuilder, fn: ir.Function, status_field=None):
        """`status_field`: (closure struct type, field index) of the pointer through which an
        outlined parallel chunk reports a failure to its kernel (None for the kernel itself,
        which returns its status); the caller's error record is the field after it."""
        self.mb = mb
        self.fn = fn
        # entry: allocas; heap: the scratch buffers' aligned_alloc calls; check: all of them
        # succeeded? (both filled as buffers are met, terminated by finish()); then the body.
        self.entry = fn.append_basic_block("entry")
        self.heap_block = fn.append_basic_block("heap")
        self.check_block = fn.append_basic_block("check")
        self.builder = ir.IRBuilder(fn.append_basic_block("body"))
        self.body_block = self.builder.block
        self.vars: dict = {}
        self.buffers: dict = {}
        self.heap_buffers: list = []   # (pointer, its slot or None: freed on exit)
        self.stack_bytes = 0
        # llvmlite has no type information: its names in these annotations are Any to mypy, the
        # `| None` is what gets checked.
        self.vec_var: Var | None = None
        self.lanes = 0
        self.mask: ir.Value | None = None
        self.ranges: dict = {}
        self.in_parallel = False
        self._exit: ir.Block | None = None        # the failure exit: frees, returns its phi's status
        self._exit_status: ir.Value | None = None
        self.error_ptr: ir.Value | None = None
        ir.IRBuilder(self.entry).branch(self.heap_block)
        self.heap_builder = ir.IRBuilder(self.heap_block)   # at the end of the allocations' blocks
        self.status_ptr: ir.Value | None = None
        if status_field is not None:
            struct_t, index = status_field
            b = self.heap_builder
            field = b.gep(fn.args[0], [ir.Constant(I32, 0), ir.Constant(I32, index)], source_etype=struct_t)
            self.status_ptr = b.load(field, typ=PTR)
            record = b.gep(fn.args[0], [ir.Constant(I32, 0), ir.Constant(I32, index + 1)], source_etype=struct_t)
            self.error_ptr = b.load(record, typ=PTR)

    def finish(self):
        """Free the heap buffers and return; wire up the allocation check and the failure exit
        (filled last: it frees every heap buffer, including those met after a branch to it)."""
        self._free_heap_buffers(self.builder)
        self._return(self.builder, ir.Constant(I32, KERNEL_OK))
        self.heap_builder.branch(self.check_block)
        b = ir.IRBuilder(self.check_block)
        if not self.heap_buffers:
            b.branch(self.body_block)
        else:
            failed = None
            for ptr, _ in self.heap_buffers:
                null = b.icmp_unsigned("==", ptr, ir.Constant(PTR, None))
                failed = null if failed is None else b.or_(failed, null)
            oom = self.fn.append_basic_block("out_of_memory")
            b.cbranch(failed, oom, self.body_block)
            self.fail(ir.IRBuilder(oom), ir.Constant(I32, KERNEL_OUT_OF_MEMORY))
        if self._exit is not None:
            b = ir.IRBuilder(self._exit)
            b.position_at_end(self._exit)
            self._free_heap_buffers(b)
            self._return(b, self._exit_status)

    def fail(self, b, status):
        """End `b`'s block with a jump to the failure exit, which gives back every heap buffer (a
        null one empties its slot, freeing what another call left there) and reports `status`
        (an i32 value)."""
        if self._exit is None:
            self._exit = self.fn.append_basic_block("failed")
            self._exit_status = ir.IRBuilder(self._exit).phi(I32, name="status")
        phi = self._exit_status
        assert phi is not None
        phi.add_incoming(status, b.block)
        b.branch(self._exit)

    def _free_heap_buffers(self, b):
        """Each heap buffer back into its slot; what the slot held (another call's, or nothing:
        free(NULL) is a no-op) freed."""
        free = self.mb.declare("free", ir.VoidType(), [PTR])
        for ptr, slot in reversed(self.heap_buffers):
            if slot is not None:
                ptr = b.inttoptr(b.atomic_rmw("xchg", slot, b.ptrtoint(ptr, I64), "acq_rel"), PTR)
            b.call(free, [ptr])

    def _return(self, b, status):
        if self.status_ptr is None:
            b.ret(status)
            return
        if not (isinstance(status, ir.Constant) and status.constant == KERNEL_OK):
            # several threads may fail at once: an atomic or, not a store
            b.atomic_rmw("or", self.status_ptr, status, "monotonic")
        b.ret_void()

    # ------------------------------------------------------------------ statements
    def emit_stmt(self, s: Stmt):
        if isinstance(s, (Seq, Allocate)) and self.mb.teams and not self.in_parallel and self.vec_var is None:
            plan = team_plan(s)
            if plan is not None:
                self.emit_team_plan(*plan)
                return
        if isinstance(s, Seq):
            for x in s.stmts:
                self.emit_stmt(x)
        elif isinstance(s, For):
            self.emit_for(s)
        elif isinstance(s, Store):
            self.emit_store(s)
        elif isinstance(s, Prefetch):
            self.emit_prefetch(s)
        elif isinstance(s, Allocate):
            self.emit_allocate(s)
        elif isinstance(s, IfThenElse):
            self.emit_if(s)
        elif isinstance(s, LetStmt):
            self.vars[s.var] = self.emit_expr(s.value)
            self.emit_stmt(s.body)
        else:
            raise TypeError(f"cannot generate code for {type(s).__name__}")

    def emit_for(self, s: For):
        self.ranges[s.var] = (0, s.extent - 1)
        if s.kind == "unrolled":
            for i in range(s.extent):
                self.vars[s.var] = ir.Constant(I64, i)
                self.emit_stmt(s.body)
            return
        if s.kind == "vectorized" and self.vec_var is None:
            self.vec_var, self.lanes = s.var, s.extent
            self.vars[s.var] = ir.Constant(ir.VectorType(I64, s.extent), list(range(s.extent)))
            self.emit_stmt(s.body)
            self.vec_var, self.lanes = None, 0
            return
        if s.kind == "parallel" and not self.in_parallel and self.vec_var is None and s.extent > 1:
            self.emit_parallel(s)
            return
        self.emit_serial_loop(s.var, ir.Constant(I64, 0), ir.Constant(I64, s.extent), s.body)

    def emit_serial_loop(self, var, start, end, body, timed=None):
        """`timed`: the parallel loop whose chunk this is, in a profiling build (each iteration's
        cycles added to its slot); None otherwise."""
        b = self.builder
        pre = b.block
        loop = self.fn.append_basic_block(f"for_{var.name}")
        exit_ = self.fn.append_basic_block(f"end_{var.name}")
        if isinstance(start, ir.Constant) and isinstance(end, ir.Constant):
            b.branch(loop)
        else:
            b.cbranch(b.icmp_signed("<", start, end), loop, exit_)
        b.position_at_end(loop)
        phi = b.phi(I64, name=var.name)
        phi.add_incoming(start, pre)
        self.vars[var] = phi
        started = self.mb.region_clock.start(self, timed) if timed is not None else None
        self.emit_stmt(body)
        if timed is not None:
            self.mb.region_clock.end_iteration(self, timed, started, phi)
        nxt = self.builder.add(phi, ir.Constant(I64, 1), name=f"{var.name}_next", flags=("nsw", "nuw"))
        phi.add_incoming(nxt, self.builder.block)
        self.builder.cbranch(self.builder.icmp_signed("<", nxt, end), loop, exit_)
        self.builder.position_at_end(exit_)

    def emit_parallel(self, s: For):
        """Outline the loop body; each libgomp thread claims contiguous chunks of iterations from
        the loop's counter (_emit_counted_chunks), set to 0 before the fork."""
        mb = self.mb
        mb.n_outlined += 1
        name = f"{self.fn.name}_par{mb.n_outlined}"
        status = self._status_slot()
        b = self.builder
        with b.goto_block(self.entry):
            b.position_at_start(self.entry)
            counter = _opaque_alloca(b, ir.ArrayType(I64, COUNTER_STRIDE), "chunk_counter")
            counter.align = 64
        b.store(ir.Constant(I64, 0), counter)
        member = self._outline(s, name + "_body", status, [counter])
        thread_entry = ir.Function(mb.module, ir.FunctionType(ir.VoidType(), [PTR]), name=name)
        thread_entry.linkage = "internal"
        eb = ir.IRBuilder(thread_entry.append_basic_block("entry"))
        member.call(eb, thread_entry.args[0])
        eb.ret_void()
        self._fork(thread_entry, member.closure, parallel_team_cap(s), [s], status)
        _emit_counted_chunks(member, s)
        member.child.finish()

    def emit_team(self, loops: tuple, barriers: tuple):
        """Consecutive parallel loops (compiler/parallel_teams.py) on one team: one fork, each
        loop's chunks claimed from its own counter, a barrier before each loop `barriers` marks
        (one that touches what an earlier loop wrote), one join. Each loop's body is its own
        outlined function whose buffers are `noalias` arguments, as a lone region's: the promise
        holds for the span of one loop, where the threads touch disjoint elements, and not across
        a barrier, where one loop reads what another thread's chunk of an earlier loop wrote."""
        mb = self.mb
        mb.n_outlined += 1
        name = f"{self.fn.name}_team{mb.n_outlined}"
        status = self._status_slot()
        b = self.builder
        counters_t = ir.ArrayType(I64, COUNTER_STRIDE * len(loops))
        table_t = ir.LiteralStructType([PTR] * len(loops))
        with b.goto_block(self.entry):
            b.position_at_start(self.entry)
            counters = _opaque_alloca(b, counters_t, "chunk_counters")
            counters.align = 64
            table = _opaque_alloca(b, table_t, "team")
        members = []
        for i, loop in enumerate(loops):
            counter = b.gep(counters, [ir.Constant(I32, 0), ir.Constant(I32, i * COUNTER_STRIDE)], source_etype=counters_t)
            b.store(ir.Constant(I64, 0), counter)
            member = self._outline(loop, f"{name}_{i}", status, [counter])
            b.store(member.closure, b.gep(table, [ir.Constant(I32, 0), ir.Constant(I32, i)], source_etype=table_t))
            members.append(member)
        team_entry = ir.Function(mb.module, ir.FunctionType(ir.VoidType(), [PTR]), name=name)
        team_entry.linkage = "internal"
        eb = ir.IRBuilder(team_entry.append_basic_block("entry"))
        barrier = mb.declare("GOMP_barrier", ir.VoidType(), [])
        for i, member in enumerate(members):
            closure = eb.load(eb.gep(team_entry.args[0], [ir.Constant(I32, 0), ir.Constant(I32, i)],
                                     source_etype=table_t), typ=PTR)
            if barriers[i]:
                eb.call(barrier, [])
            member.call(eb, closure)
        eb.ret_void()
        self._fork(team_entry, table, max(parallel_team_cap(loop) for loop in loops), list(loops), status)
        for member, loop in zip(members, loops):
            _emit_counted_chunks(member, loop)
            member.child.finish()

    def _status_slot(self):
        """An i32 slot in the entry block through which outlined threads report a failure; set to
        KERNEL_OK here, before the fork."""
        b = self.builder
        with b.goto_block(self.entry):
            b.position_at_start(self.entry)
            status = _opaque_alloca(b, I32, "thread_status")
        b.store(ir.Constant(I32, KERNEL_OK), status)
        return status

    def _outline(self, s: For, name: str, status, extra: list) -> _Outlined:
        """The body of parallel loop `s` as function `name`: its closure (the loop body's free
        variables, its buffers, the status slot, the error record, then `extra` pointers) filled
        here, and the emitter of the function, whose loop over chunks the caller emits."""
        mb = self.mb
        used_vars = _free_vars_of(s.body) - {s.var}
        captured_vars = [v for v in self.vars if v in used_vars]
        used_bufs = _buffers_of(s.body)
        captured_bufs = [bf for bf in self.buffers if bf in used_bufs]
        fields = [self.vars[v].type for v in captured_vars] + [PTR] * (len(captured_bufs) + 2 + len(extra))
        struct_t = ir.LiteralStructType(fields)
        fn = ir.Function(mb.module, ir.FunctionType(ir.VoidType(), [PTR] * (1 + len(captured_bufs))), name=name)
        fn.linkage = "internal"
        for a in fn.args[1:]:
            a.add_attribute("noalias")
        b = self.builder
        with b.goto_block(self.entry):
            b.position_at_start(self.entry)
            closure = _opaque_alloca(b, struct_t, "closure")
        values = [self.vars[v] for v in captured_vars] + [self.buffers[bf] for bf in captured_bufs]
        values += [status, self.error_ptr, *extra]
        for i, val in enumerate(values):
            b.store(val, b.gep(closure, [ir.Constant(I32, 0), ir.Constant(I32, i)], source_etype=struct_t))
        first_buffer = len(captured_vars)
        child = FunctionEmitter(mb, fn, status_field=(struct_t, first_buffer + len(captured_bufs)))
        child.in_parallel = True
        child.ranges = dict(self.ranges)
        child.ranges[s.var] = (0, s.extent - 1)
        cb = child.builder
        for i, v in enumerate(captured_vars):
            child.vars[v] = cb.load(cb.gep(fn.args[0], [ir.Constant(I32, 0), ir.Constant(I32, i)], source_etype=struct_t),
                                    typ=fields[i])
        child.buffers.update(zip(captured_bufs, fn.args[1:]))
        return _Outlined(fn, struct_t, closure, child, first_buffer, len(captured_bufs), len(values) - len(extra))

    def _fork(self, entry: ir.Function, data, cap: int, loops: list, status):
        """GOMP_parallel(entry, data) on min(cap, the thread count) threads; a failure a thread
        reported ends the kernel with it. A profiling build counts the fork's span on the first
        of `loops` and an entry on each."""
        mb, b = self.mb, self.builder
        gomp = mb.declare("GOMP_parallel", ir.VoidType(), [PTR, PTR, I32, I32])
        most = b.call(mb.declare("omp_get_max_threads", I32, []), [])
        cap_c = ir.Constant(I32, cap)
        team = b.select(b.icmp_signed("<", cap_c, most), cap_c, most)
        clock = mb.region_clock
        started = clock.start(self, loops[0]) if clock is not None else None
        b.call(gomp, [entry, data, team, ir.Constant(I32, 0)])
        if clock is not None:
            clock.end_region(self, loops[0], started)
            for loop in loops[1:]:
                clock.count_entry(self, loop)
        reported = b.load(status, typ=I32)
        failed = b.icmp_signed("!=", reported, ir.Constant(I32, KERNEL_OK))
        after = self.fn.append_basic_block(f"after_par{mb.n_outlined}")
        par_failed = self.fn.append_basic_block(f"failed_par{mb.n_outlined}")
        b.cbranch(failed, par_failed, after)
        self.fail(ir.IRBuilder(par_failed), reported)
        b.position_at_end(after)

    def emit_team_plan(self, allocates: list, items: list):
        """A sequence whose consecutive parallel loops run as teams (compiler/parallel_teams.py):
        its scratch buffers declared first (they live at the function's entry either way)."""
        for a in allocates:
            if a.buffer not in self.buffers:
                self.buffers[a.buffer] = self._hoisted_buffer(a.buffer)
        for item in items:
            if isinstance(item, Team):
                self.emit_team(item.loops, item.barriers)
            else:
                self.emit_stmt(item)

    def emit_allocate(self, s: Allocate):
        """Scratch memory for `s.buffer`, hoisted to the function's entry: a loop that declares it
        reuses it on every iteration (each iteration writes before it reads), and an unrolled
        loop's copies share it instead of each taking a stack slot."""
        buf = s.buffer
        if buf not in self.buffers:
            self.buffers[buf] = self._hoisted_buffer(buf)
        self.emit_stmt(s.body)

    def _hoisted_buffer(self, buf: Buffer):
        ety = MEMTYPE[buf.dtype]
        nbytes = buf.nbytes
        if nbytes <= STACK_LIMIT_BYTES and self.stack_bytes + nbytes <= STACK_BUDGET_BYTES:
            self.stack_bytes += nbytes
            b = ir.IRBuilder(self.entry)
            b.position_at_start(self.entry)
            ptr = _opaque_alloca(b, ir.ArrayType(ety, buf.size), buf.name)
            ptr.align = 64
            return ptr
        size = -(-nbytes // 64) * 64
        if self.status_ptr is None:
            return self._kept_heap_buffer(buf.name, size)
        ptr = self.heap_builder.call(self.mb.declare("aligned_alloc", PTR, [I64, I64]),
                                     [ir.Constant(I64, 64), ir.Constant(I64, size)], name=buf.name)
        self.heap_buffers.append((ptr, None))
        return ptr

    def _kept_heap_buffer(self, name: str, size: int):
        """A 64-byte aligned heap buffer of `size` bytes: the one its slot kept from an earlier
        call (taken by atomic exchange), else a new one (null when out of memory)."""
        slot = self.mb.scratch_slot(f"{self.fn.name}.{name}")
        b = self.heap_builder
        held = b.inttoptr(b.atomic_rmw("xchg", slot, ir.Constant(I64, 0), "acq_rel"), PTR)
        took = b.block
        alloc_block = self.fn.append_basic_block(f"alloc.{name}")
        got_block = self.fn.append_basic_block(f"got.{name}")
        b.cbranch(b.icmp_unsigned("==", held, ir.Constant(PTR, None)), alloc_block, got_block)
        ab = ir.IRBuilder(alloc_block)
        fresh = ab.call(self.mb.declare("aligned_alloc", PTR, [I64, I64]), [ir.Constant(I64, 64), ir.Constant(I64, size)])
        ab.branch(got_block)
        b.position_at_end(got_block)
        ptr = b.phi(PTR, name=name)
        ptr.add_incoming(held, took)
        ptr.add_incoming(fresh, alloc_block)
        self.heap_buffers.append((ptr, slot))
        return ptr

    def emit_if(self, s: IfThenElse):
        cond = self.emit_expr(s.cond)
        if isinstance(cond.type, ir.VectorType):
            saved = self.mask
            self.mask = cond if saved is None else self.builder.and_(saved, cond)
            self.emit_stmt(s.then)
            if s.else_ is not None:
                inv = self.builder.not_(cond)
                self.mask = inv if saved is None else self.builder.and_(saved, inv)
                self.emit_stmt(s.else_)
            self.mask = saved
            return
        b = self.builder
        if s.else_ is None:
            with b.if_then(cond):
                self.emit_stmt(s.then)
        else:
            with b.if_else(cond) as (then, otherwise):
                with then:
                    self.emit_stmt(s.then)
                with otherwise:
                    self.emit_stmt(s.else_)

    # ------------------------------------------------------------------ memory
    def _access(self, buf: Buffer, index: Expr):
        """('scalar', ptr) | ('contiguous', ptr) | ('lanes', [ptr per lane]) | ('gather', <N x ptr>)
        for the current lanes."""
        b = self.builder
        ety = MEMTYPE[buf.dtype]
        base_ptr = self.buffers[buf]
        v = self.vec_var
        if v is None or v not in _free_vars(index):
            return "scalar", b.gep(base_ptr, [self._scalar_index(index)], source_etype=ety)
        lin = arith.to_lin(index, self.ranges)
        linear = not any(v in _free_vars(a) for a, _ in lin.terms.values() if a is not v)
        if lin.coef_of(v) == 1 and linear:
            base = arith.substitute_var(index, v, Const(0, "int64"), self.ranges)
            return "contiguous", b.gep(base_ptr, [self._scalar_index(base)], source_etype=ety)
        if linear and self.mask is None and isinstance(base_ptr, ir.AllocaInstr) and lin.coef_of(v) != 0:
            # a strided access to a stack buffer: one scalar access per lane at constant offsets,
            # which SROA can still turn into registers; a gather or scatter takes the buffer's
            # address and keeps it in memory (a register tile read across its vector axis, e.g.
            # a channel-vector convolution tile stored along its rows, then spills every FMA)
            first = self._scalar_index(arith.substitute_var(index, v, Const(0, "int64"), self.ranges))
            step = lin.coef_of(v)
            return "lanes", [b.gep(base_ptr, [b.add(first, ir.Constant(first.type, step * lane))], source_etype=ety)
                             for lane in range(self.lanes)]
        idx = self._broadcast(self.emit_expr(index))
        return "gather", _vector_gep(b, base_ptr, idx, ety)

    def _scalar_index(self, index: Expr):
        val = self.emit_expr(index)
        return val

    def emit_load(self, e: Load):
        v = self._emit_load_mem(e)
        if e.buffer.dtype == "bool":  # bytes -> i1
            v = self.builder.icmp_unsigned("!=", v, ir.Constant(v.type, None))
        return v

    def _emit_load_mem(self, e: Load):
        clamped = self._clamped_unit_stride(e.index)
        if clamped is not None:
            return self._emit_clamped_load(e, *clamped)
        return self._emit_load_at(e, e.index)

    def _clamped_unit_stride(self, index: Expr):
        """(index without its clamps, [Compare: the clamps do nothing on these lanes]) for a
        vector read whose index is unit-stride in the lanes but for min/max clamps against
        lane-free bounds (a tile's overhang, a border clamp), which make it a gather; else None."""
        v = self.vec_var
        if v is None or v not in _free_vars(index) or not any(
                isinstance(n, Binary) and n.op in ("min", "max") for n in walk(index)):
            return None
        clamps = []

        def peel(n):
            if isinstance(n, Binary) and n.op in ("min", "max"):
                for inner, bound in ((n.a, n.b), (n.b, n.a)):
                    if v in _free_vars(inner) and v not in _free_vars(bound):
                        clamps.append((inner, n.op, bound))
                        return inner
            return None

        bare = transform(index, peel)
        lin = arith.to_lin(bare, self.ranges)
        if not clamps or lin.coef_of(v) != 1 or any(v in _free_vars(a) for a, _ in lin.terms.values() if a is not v):
            return None
        conds = []
        for inner, op, bound in clamps:
            il = arith.to_lin(inner, self.ranges)
            if il.coef_of(v) < 0 or any(v in _free_vars(a) for a, _ in il.terms.values() if a is not v):
                return None
            at = Const(self.lanes - 1 if op == "min" else 0, "int64")
            edge = arith.substitute_var(inner, v, at, self.ranges)
            conds.append(Compare("le", edge, bound) if op == "min" else Compare("ge", edge, bound))
        return bare, clamps, conds

    def _emit_clamped_load(self, e: Load, bare: Expr, clamps: list, conds: list):
        """A vector load of a clamped unit-stride index: one vector load where every clamp is
        inactive on all lanes (the interior, nearly always); where one bites (the last,
        overhanging tile of a row), _emit_clamp_edge_load, or the gather of the clamped index."""
        b = self.builder
        cond = self.emit_expr(conds[0])
        for c in conds[1:]:
            cond = b.and_(cond, self.emit_expr(c))
        with b.if_else(cond) as (inside, edge):
            with inside:
                fast = self._emit_load_at(e, bare)
                fast_block = b.block
            with edge:
                slow = self._emit_clamp_edge_load(e, bare, clamps)
                slow_block = b.block
        phi = b.phi(fast.type)
        phi.add_incoming(fast, fast_block)
        phi.add_incoming(slow, slow_block)
        return phi

    def _emit_clamp_edge_load(self, e: Load, bare: Expr, clamps: list):
        """Lanes past the clamps of one term read the element at its bound: a masked vector load
        of the lanes no clamp bites and one broadcast element per clamp (an overhanging tile of
        35 columns in 16 lanes gathered a third of an average pool's loads, 0.37 ms against
        onnxruntime's 0.05). Clamps of several terms: the gather."""
        inner = clamps[0][0]
        lows = [bd.value for _, op, bd in clamps if op == "max" and isinstance(bd, Const)]
        highs = [bd.value for _, op, bd in clamps if op == "min" and isinstance(bd, Const)]
        crossing = len(clamps) > 1 and (len(lows) + len(highs) < len(clamps) or (lows and highs and max(lows) > min(highs)))
        if any(c[0] is not inner for c in clamps) or crossing:   # not one term in [low, high]: as written
            return self._emit_load_at(e, e.index)
        b = self.builder
        saved = self.mask
        bites = [self.emit_expr(Compare("gt" if op == "min" else "lt", inner, bound)) for _, op, bound in clamps]
        bitten = bites[0]
        for m in bites[1:]:
            bitten = b.or_(bitten, m)
        free = b.not_(bitten)
        try:
            self.mask = free if saved is None else b.and_(saved, free)
            value = self._emit_load_at(e, bare)
            for (_, _, bound), bite in zip(clamps, bites):
                self.mask = bite if saved is None else b.and_(saved, bite)
                at_bound = transform(bare, lambda n, bound=bound: bound if n is inner else None)
                element = self._emit_load_at(e, at_bound)
                value = b.select(bite, self._broadcast(element), value)
        finally:
            self.mask = saved
        return value

    def _emit_load_at(self, e: Load, index: Expr):
        b = self.builder
        ety = MEMTYPE[e.buffer.dtype]
        kind, ptr = self._access(e.buffer, index)
        align = ety.width // 8 if isinstance(ety, ir.IntType) else (4 if ety == F32 else 8)
        if e.buffer.dtype == "bool":
            align = 1
        if kind == "scalar":
            if self.mask is not None:
                # a uniform address read under a lane mask: only safe if some lane is active
                return self._masked_scalar_load(ptr, ety, self.mask)
            return b.load(ptr, typ=ety, align=align)
        vty = ir.VectorType(ety, self.lanes)
        if kind == "lanes":
            vec = ir.Constant(vty, None)
            for lane, p in enumerate(ptr):
                vec = b.insert_element(vec, b.load(p, typ=ety, align=align), ir.Constant(I32, lane))
            return vec
        if kind == "contiguous":
            if self.mask is None:
                return b.load(ptr, typ=vty, align=align)
            fn = self.mb.intrinsic("llvm.masked.load", vty, [PTR, I32, self.mask.type, vty], [vty, PTR])
            return b.call(fn, [ptr, ir.Constant(I32, align), self.mask, ir.Constant(vty, None)])
        mask = self.mask if self.mask is not None else ir.Constant(ir.VectorType(I1, self.lanes), [1] * self.lanes)
        pty = ir.VectorType(PTR, self.lanes)
        fn = self.mb.intrinsic("llvm.masked.gather", vty, [pty, I32, mask.type, vty], [vty, pty])
        return b.call(fn, [ptr, ir.Constant(I32, align), mask, ir.Constant(vty, None)])

    def _masked_scalar_load(self, ptr, ety, mask):
        b = self.builder
        any_fn = self.mb.intrinsic("llvm.vector.reduce.or", I1, [mask.type], [mask.type])
        active = b.call(any_fn, [mask])
        pre = b.block
        with b.if_then(active):
            val = b.load(ptr, typ=ety)
            then_block = b.block
        phi = b.phi(ety)
        phi.add_incoming(val, then_block)
        phi.add_incoming(ir.Constant(ety, None), pre)
        return phi

    def emit_prefetch(self, s: Prefetch):
        """llvm.prefetch of buffer[index] for reading into every cache level (locality 3): the
        address is not dereferenced, so an index past the buffer (the stream's end) is harmless.
        Lowering places prefetches outside vectorized loops, so the index is one scalar."""
        b = self.builder
        ptr = b.gep(self.buffers[s.buffer], [self._scalar_index(s.index)], source_etype=MEMTYPE[s.buffer.dtype])
        fn = self.mb.intrinsic("llvm.prefetch", ir.VoidType(), [PTR, I32, I32, I32], [PTR])
        b.call(fn, [ptr, ir.Constant(I32, 0), ir.Constant(I32, 3), ir.Constant(I32, 1)])

    def emit_store(self, s: Store):
        b = self.builder
        ety = MEMTYPE[s.buffer.dtype]
        value = self.emit_expr(s.value)
        if s.buffer.dtype == "bool":  # i1 -> one byte per element
            value = b.zext(value, ir.VectorType(I8, value.type.count) if isinstance(value.type, ir.VectorType) else I8)
        kind, ptr = self._access(s.buffer, s.index)
        if kind == "scalar":
            if isinstance(value.type, ir.VectorType):
                # every lane writes the same element; the last active lane wins, as in the scalar loop
                kind = "gather"
                ptr = _vector_gep(b, self.buffers[s.buffer], self._broadcast(self._scalar_index(s.index)), ety)
            elif self.mask is not None:
                any_fn = self.mb.intrinsic("llvm.vector.reduce.or", I1, [self.mask.type], [self.mask.type])
                with b.if_then(b.call(any_fn, [self.mask])):
                    b.store(value, ptr)
                return
            else:
                b.store(value, ptr)
                return
        value = self._broadcast(value)
        vty = value.type
        align = 1 if s.buffer.dtype == "bool" else max(ety.width // 8, 1) if isinstance(ety, ir.IntType) else (4 if ety == F32 else 8)
        if kind == "lanes":
            for lane, p in enumerate(ptr):
                b.store(b.extract_element(value, ir.Constant(I32, lane)), p, align=align)
            return
        if kind == "contiguous":
            if self.mask is None:
                b.store(value, ptr, align=align)
                return
            # a masked store is microcoded on AMD cores (Zen 2: a register tile stored into rows
            # of 197 columns ran its 12-head Q·Kᵀ at 26 GFLOPS, 80 for 208): where every lane
            # is active, as in all but a row's last vector, a plain store
            fn = self.mb.intrinsic("llvm.masked.store", ir.VoidType(), [vty, PTR, I32, self.mask.type], [vty, PTR])
            all_fn = self.mb.intrinsic("llvm.vector.reduce.and", I1, [self.mask.type], [self.mask.type])
            with b.if_else(b.call(all_fn, [self.mask])) as (whole, part):
                with whole:
                    b.store(value, ptr, align=align)
                with part:
                    b.call(fn, [value, ptr, ir.Constant(I32, align), self.mask])
            return
        mask = self.mask if self.mask is not None else ir.Constant(ir.VectorType(I1, self.lanes), [1] * self.lanes)
        pty = ir.VectorType(PTR, self.lanes)
        fn = self.mb.intrinsic("llvm.masked.scatter", ir.VoidType(), [vty, pty, I32, mask.type], [vty, pty])
        b.call(fn, [value, ptr, ir.Constant(I32, align), mask])

    # ------------------------------------------------------------------ expressions
    def _broadcast(self, v):
        if isinstance(v.type, ir.VectorType) or self.vec_var is None:
            return v
        b = self.builder
        vty = ir.VectorType(v.type, self.lanes)
        if isinstance(v, ir.Constant):
            return ir.Constant(vty, [v.constant] * self.lanes) if v.constant is not None else ir.Constant(vty, None)
        ins = b.insert_element(ir.Constant(vty, None), v, ir.Constant(I32, 0))
        return b.shuffle_vector(ins, ir.Constant(vty, None), ir.Constant(ir.VectorType(I32, self.lanes), [0] * self.lanes))

    def _pair(self, a, b):
        if isinstance(a.type, ir.VectorType) or isinstance(b.type, ir.VectorType):
            return self._broadcast(a), self._broadcast(b)
        return a, b

    def emit_expr(self, e: Expr):
        code = _EMIT.get(type(e))
        if code is None:
            raise TypeError(f"cannot generate code for expression {type(e).__name__}")
        return code(self, e)

    def _emit_var(self, e: Var):
        if e not in self.vars:
            raise KeyError(f"variable {e.name} used outside its loop")
        return self.vars[e]

    def _emit_compare(self, e: Compare):
        a, b = self._pair(self.emit_expr(e.a), self.emit_expr(e.b))
        if e.a.dtype.startswith("float"):
            op = {"ne": "!="}.get(e.op, _ICMP[e.op])
            return self.builder.fcmp_unordered(op, a, b) if e.op == "ne" else self.builder.fcmp_ordered(op, a, b)
        return self.builder.icmp_signed(_ICMP[e.op], a, b)

    def _emit_checked(self, e: CheckedIndex):
        """The index, after a compare and an unlikely branch to a block that records the check
        and the offending value (the first bad lane's, in a vector) and exits the kernel with
        KERNEL_INDEX_OUT_OF_RANGE. Lanes the current mask switches off are not checked, like the
        loads they would feed."""
        v = self.emit_expr(e.value)
        b = self.builder
        vector = isinstance(v.type, ir.VectorType)

        def c(x):
            return ir.Constant(v.type, [x] * v.type.count) if vector else ir.Constant(I64, x)

        def clamped():   # with a wrap, a negative value counted from the end first
            smax, smin = _intrinsic_call("llvm.smax"), _intrinsic_call("llvm.smin")
            if not e.wrap:
                return smin(self, smax(self, v, c(e.lo)), c(e.hi - 1))
            wrapped = b.select(b.icmp_signed("<", v, c(0)), b.add(v, c(e.hi)), v)
            return smin(self, smax(self, wrapped, c(0)), c(e.hi - 1))
        if not self.mb.index_checks:   # clamped, for the cost comparison only
            return clamped()
        number = self.mb.check_number(e)
        bad = b.icmp_unsigned(">=", b.sub(v, c(e.lo)), c(e.hi - e.lo))   # one compare for both ends
        if vector:
            if self.mask is not None:
                bad = b.and_(bad, self.mask)
            fires = b.call(self.mb.intrinsic("llvm.vector.reduce.or", I1, [bad.type], [bad.type]), [bad])
        else:
            fires = bad
            if self.mask is not None:   # a uniform index under a lane mask: only where a lane reads
                active = b.call(self.mb.intrinsic("llvm.vector.reduce.or", I1, [self.mask.type], [self.mask.type]),
                                [self.mask])
                fires = b.and_(bad, active)
        error = self.fn.append_basic_block("index_error")
        ok = self.fn.append_basic_block("index_ok")
        b.cbranch(fires, error, ok).set_weights([1, 1 << 20])
        eb = ir.IRBuilder(error)
        value = v
        if vector:
            bits = ir.IntType(v.type.count)
            first = eb.call(self.mb.intrinsic("llvm.cttz", bits, [bits, I1], [bits]),
                            [eb.bitcast(bad, bits), ir.Constant(I1, 0)])
            value = eb.extract_element(v, eb.zext(first, I64) if bits.width < 64 else first)
        self._record_index_error(eb, number, value)
        # in a parallel loop this thread leaves its chunks; the others stop at their next claim
        self.fail(eb, ir.Constant(I32, KERNEL_INDEX_OUT_OF_RANGE))
        b.position_at_end(ok)
        # the value, clamped where it already lies: LLVM learns its range, which it does not from
        # a branch on the lanes' or-reduced compare (a vector `% 768` of an unbounded int64 was
        # scalarized, the clamped one narrowed and kept in vectors: 1.4x a fused gather's time)
        return clamped()

    def _record_index_error(self, b, number: int, value):
        """The caller's error record (when there is one) takes check `number` and `value`, unless
        another thread's check got there first (compare-and-swap on its first word)."""
        record = self.error_ptr
        with b.if_then(b.icmp_unsigned("!=", record, ir.Constant(PTR, None))):
            first = b.cmpxchg(record, ir.Constant(I64, 0), ir.Constant(I64, number + 1), "monotonic", "monotonic")
            with b.if_then(b.extract_value(first, 1)):
                b.store(value, b.gep(record, [ir.Constant(I64, 1)], source_etype=I64))

    def _emit_logical(self, e: Logical):
        if _reads_memory(e.b):
            # `a && b` reads in b only where a holds (and `a || b` only where it does not):
            # guards such as `i < n && A[i] > 0` are written that way and proven so
            on_true, on_false = (e.b, Const(False, "bool")) if e.op == "and" else (Const(True, "bool"), e.b)
            return self.emit_select(Select(e.a, on_true, on_false))
        a, b = self._pair(self.emit_expr(e.a), self.emit_expr(e.b))
        return self.builder.and_(a, b) if e.op == "and" else self.builder.or_(a, b)

    def _emit_call(self, e: Call):
        from .intrinsics import emit_math
        return emit_math(self, e.func, self.emit_expr(e.args[0]), e.dtype)

    def emit_select(self, e: Select):
        b = self.builder
        static = self._static_condition(e.cond)
        if static is not None:
            # the condition is settled here (an unrolled loop's constant picks a row of a
            # Winograd transform): only the branch taken is emitted
            v = self.emit_expr(e.t if static else e.f)
            per_lane = self.vec_var is not None and self.vec_var in _free_vars(e)
            return self._broadcast(v) if per_lane else v
        cond = self.emit_expr(e.cond)
        has_loads = _reads_memory(e.t) or _reads_memory(e.f)
        if not has_loads:
            t, f = self._pair(self.emit_expr(e.t), self.emit_expr(e.f))
            if isinstance(t.type, ir.VectorType):
                cond = self._broadcast(cond)
            elif isinstance(cond.type, ir.VectorType):  # uniform branches, per-lane condition
                t, f = self._broadcast(t), self._broadcast(f)
            return b.select(cond, t, f)
        if isinstance(cond.type, ir.VectorType):
            # loads in a branch may be out of bounds on the lanes that do not take it: mask them
            saved = self.mask
            self.mask = cond if saved is None else b.and_(saved, cond)
            t = self.emit_expr(e.t)
            inv = b.not_(cond)
            self.mask = inv if saved is None else b.and_(saved, inv)
            f = self.emit_expr(e.f)
            self.mask = saved
            t, f = self._broadcast(t), self._broadcast(f)
            return b.select(cond, t, f)
        # scalar condition: real control flow so the untaken branch's loads never happen. Inside
        # a vector loop a branch that reads the vector variable is per-lane: then both are made
        # vectors in their own block, so the phi that joins them comes first in the join block
        # and sees equal types. Branches that do not are uniform and stay scalars: the select may
        # be an address (t[select(i[a] < 0, i[a] + n, i[a]), c] with c the vector), which must
        # stay one pointer, not become a vector of them.
        v = self.vec_var
        per_lane = v is not None and (v in _free_vars(e.t) or v in _free_vars(e.f))
        lanes_of = self._broadcast if per_lane else (lambda x: x)
        with b.if_else(cond) as (then, otherwise):
            with then:
                t = lanes_of(self.emit_expr(e.t))
                tb = b.block
            with otherwise:
                f = lanes_of(self.emit_expr(e.f))
                fb = b.block
        phi = b.phi(t.type)
        phi.add_incoming(t, tb)
        phi.add_incoming(f, fb)
        return phi

    def _static_condition(self, cond: Expr) -> bool | None:
        """The condition's value where an unrolled loop's constant (with the other loops'
        ranges) settles it, else None. Conditions of no unrolled variable are left to LLVM, so
        the common Select (a padding test in a loop) costs no simplification here."""
        free = _free_vars(cond)
        if self.vec_var in free:
            return None
        constants = {v: int(val.constant) for v in free
                     if isinstance(val := self.vars.get(v), ir.Constant) and isinstance(val.type, ir.IntType)}
        if not constants:
            return None
        ranges = {v: (c, c) for v, c in constants.items()}
        ranges.update((v, self.ranges[v]) for v in free if v not in constants and v in self.ranges)
        c = arith.simplify(cond, ranges)
        return bool(c.value) if isinstance(c, Const) else None

    def emit_binary(self, e: Binary):
        x, y = self.emit_expr(e.a), self.emit_expr(e.b)
        if e.op == "div" and e.dtype.startswith("float") and isinstance(x.type, ir.VectorType) \
                and not isinstance(y.type, ir.VectorType) and not isinstance(y, ir.Constant):
            # a vector divided by a value uniform across its lanes (softmax's row sum, a norm's
            # deviation): one scalar reciprocal (hoisted out of the loop where the value is
            # invariant) and a multiply per vector; a vector division is 5-10x a multiply's
            # throughput. Within an ulp of the division; constant divisors keep it (exact).
            one = ir.Constant(y.type, 1.0)
            return self.builder.fmul(x, self._broadcast(self.builder.fdiv(one, y)), flags=FAST)
        x, y = self._pair(x, y)
        table = _FLOAT_OPS if e.dtype.startswith("float") else _INT_OPS
        code = table.get(e.op)
        if code is None:
            raise TypeError(f"no code for {e.op} on {e.dtype}")
        return code(self, x, y)

    def _float_min_max(self, op: str, x, y):
        """numpy's maximum/minimum: NaN if either side is NaN, as compare + select.

        Not `llvm.maxnum`/`minnum`: they drop NaNs, and LLVM 22's vectorizer miscompiles
        reductions over them (wrong maxima, or an assertion that aborts the process). A plain
        select is compiled correctly by every LLVM the project allows.
        """
        b = self.builder
        wins = b.fcmp_ordered(">" if op == "max" else "<", x, y)
        return b.select(b.or_(wins, b.fcmp_unordered("uno", x, x)), x, y)

    def _division_operands(self, x, y):
        """(y_safe, y_is_zero) for an integer division that can never trap.

        x // 0 and x % 0 are 0 (numpy's result), INT_MIN // -1 wraps to INT_MIN (numpy's too):
        hardware division traps (SIGFPE) on both, so those lanes divide by 1 instead and a zero
        divisor's result is replaced afterwards. Switched-off lanes under a mask (masked loads give
        0) are covered by the same rule. With a constant divisor LLVM folds all of it away.
        """
        b = self.builder
        ty = x.type
        width = (ty.element if isinstance(ty, ir.VectorType) else ty).width
        lanes = ty.count if isinstance(ty, ir.VectorType) else None

        def c(v):
            return ir.Constant(ty, [v] * lanes) if lanes else ir.Constant(ty, v)
        y_zero = b.icmp_signed("==", y, c(0))
        overflow = b.and_(b.icmp_signed("==", x, c(-(1 << (width - 1)))), b.icmp_signed("==", y, c(-1)))
        return b.select(b.or_(y_zero, overflow), c(1), y), y_zero

    def _floor_adjust(self, r, y):
        """True where truncated division must be moved one step down to floor division."""
        b = self.builder
        zero = ir.Constant(r.type, None)
        return b.and_(b.icmp_signed("!=", r, zero),
                      b.icmp_signed("!=", b.icmp_signed("<", r, zero), b.icmp_signed("<", y, zero)))

    def _floordiv(self, x, y):
        b = self.builder
        y, y_zero = self._division_operands(x, y)
        q = b.sdiv(x, y)
        q = b.sub(q, b.zext(self._floor_adjust(b.srem(x, y), y), x.type))
        return b.select(y_zero, ir.Constant(x.type, None), q)

    def _floormod(self, x, y):
        b = self.builder
        y, y_zero = self._division_operands(x, y)
        r = b.srem(x, y)
        r = b.select(self._floor_adjust(r, y), b.add(r, y), r)
        return b.select(y_zero, ir.Constant(x.type, None), r)

    def emit_cast(self, e: Cast):
        b = self.builder
        v = self.emit_expr(e.value)
        src, dst = e.value.dtype, e.dtype
        lanes = v.type.count if isinstance(v.type, ir.VectorType) else None
        t = LLTYPE[dst] if lanes is None else ir.VectorType(LLTYPE[dst], lanes)
        if dst == "bool":
            zero = ir.Constant(v.type, None)
            return b.fcmp_unordered("!=", v, zero) if src.startswith("float") else b.icmp_signed("!=", v, zero)
        if src == "bool":
            return b.uitofp(v, t) if dst.startswith("float") else b.zext(v, t)
        sf, df = src.startswith("float"), dst.startswith("float")
        if sf and df:
            return b.fpext(v, t) if dst == "float64" else b.fptrunc(v, t)
        if sf:  # saturating: NaN -> 0, out of range -> the nearest end (plain fptosi is poison)
            fn = self.mb.intrinsic("llvm.fptosi.sat", t, [v.type], [t, v.type])
            return b.call(fn, [v])
        if df:
            return b.sitofp(v, t)
        sw, dw = LLTYPE[src].width, LLTYPE[dst].width
        if sw == dw:
            return v
        return b.sext(v, t) if dw > sw else b.trunc(v, t)


def _vector_gep(builder, base, idx_vec, ety):
    """A vector of element pointers (llvmlite types a GEP by its base, so set the type here)."""
    gep = builder.gep(base, [idx_vec], source_etype=ety)
    gep.type = ir.VectorType(PTR, idx_vec.type.count)
    return gep


def _opaque_alloca(builder, ty, name):
    """An alloca typed as an opaque `ptr`, so GEPs on it take their element type explicitly."""
    slot = builder.alloca(ty, name=name)
    slot.type = PTR
    return slot


def _free_vars(e: Expr) -> set:
    return {n for n in walk(e) if isinstance(n, Var)}


def _reads_memory(e: Expr) -> bool:
    """Whether evaluating `e` loads memory or checks an index: then it may run only where a
    select or `&&` picks it (a guarded gather's check must not fire on the lanes it skips)."""
    return any(isinstance(n, (Load, CheckedIndex)) for n in walk(e))


def _free_vars_of(s: Stmt) -> set:
    out = set()
    for st in walk_stmts(s):
        for e in stmt_exprs(st):
            out |= _free_vars(e)
    return out


def _buffers_of(s: Stmt) -> set:
    out = set()
    for st in walk_stmts(s):
        if isinstance(st, (Store, Prefetch)):
            out.add(st.buffer)
        for e in stmt_exprs(st):
            out |= {n.buffer for n in walk(e) if isinstance(n, Load)}
    return out


def generate(func: LoweredFunc, target, index_checks: bool = True) -> ir.Module:
    """LLVM IR module for a lowered function (`index_checks`: see ModuleBuilder)."""
    return ModuleBuilder(func, target, index_checks).build()


def _intrinsic_call(name: str):
    def code(em, x, y):
        return em.builder.call(em.mb.intrinsic(name, x.type, [x.type, x.type], [x.type]), [x, y])
    return code


# code per binary operator (FunctionEmitter.emit_binary): fn(emitter, x, y) -> value
_FLOAT_OPS: dict[str, Callable[[Any, Any, Any], Any]] = {
    "add": lambda em, x, y: em.builder.fadd(x, y, flags=FAST),
    "sub": lambda em, x, y: em.builder.fsub(x, y, flags=FAST),
    "mul": lambda em, x, y: em.builder.fmul(x, y, flags=FAST),
    "div": lambda em, x, y: em.builder.fdiv(x, y),
    "min": lambda em, x, y: em._float_min_max("min", x, y),
    "max": lambda em, x, y: em._float_min_max("max", x, y),
    "pow": _intrinsic_call("llvm.pow"),
}
_INT_OPS: dict[str, Callable[[Any, Any, Any], Any]] = {
    "add": lambda em, x, y: em.builder.add(x, y),
    "sub": lambda em, x, y: em.builder.sub(x, y),
    "mul": lambda em, x, y: em.builder.mul(x, y),
    "min": _intrinsic_call("llvm.smin"),
    "max": _intrinsic_call("llvm.smax"),
    "floordiv": lambda em, x, y: em._floordiv(x, y),
    "floormod": lambda em, x, y: em._floormod(x, y),
}

# code per expression kind (FunctionEmitter.emit_expr), by exact class
_EMIT: dict[type, Callable[[Any, Any], Any]] = {
    Const: lambda em, e: ir.Constant(LLTYPE[e.dtype], e.value),
    Var: FunctionEmitter._emit_var,
    Load: FunctionEmitter.emit_load,
    Binary: FunctionEmitter.emit_binary,
    Compare: FunctionEmitter._emit_compare,
    Logical: FunctionEmitter._emit_logical,
    Not: lambda em, e: em.builder.not_(em.emit_expr(e.a)),
    Select: FunctionEmitter.emit_select,
    Cast: FunctionEmitter.emit_cast,
    Call: FunctionEmitter._emit_call,
    CheckedIndex: FunctionEmitter._emit_checked,
}

CHUNKS_PER_THREAD = 4   # a parallel loop's iterations in this many contiguous chunks per thread


COUNTER_STRIDE = 8   # i64 slots between two team loops' chunk counters: one cache line each


def _emit_counted_chunks(member: _Outlined, s: For):
    """The outlined body's loop over the chunks of `s` (a region of its own, or a team's loop):
    contiguous chunks of about extent / (team · CHUNKS_PER_THREAD) iterations, with the team
    counted up to the loop's own cap (a small loop in a team is cut into as few chunks as it
    would be as a region of its own), each claimed by an atomic add on the loop's counter by
    whichever thread is free. Dynamic, not a static split: a thread whose core is shared (a
    2-vCPU cloud host's neighbour, the tuner's own process) held up every kernel by its whole
    half; ResNet-50 ran 0.56x onnxruntime beside one busy thread. Not libgomp's work-sharing loop
    (GOMP_loop_dynamic_start/next/end): its start and end cost a fifth of a region's fork/join,
    and a thread that leaves early (its scratch allocation failed, an index check fired) would
    skip a work share, so the team's next loop would read its bounds from this one's."""
    child = member.child
    mb, cb = child.mb, child.builder
    counter = member.extra(0)
    nth = cb.sext(cb.call(mb.declare("omp_get_num_threads", I32, []), []), I64)
    cap = ir.Constant(I64, parallel_team_cap(s))
    nth = cb.select(cb.icmp_signed("<", nth, cap), nth, cap)
    per = cb.mul(nth, ir.Constant(I64, CHUNKS_PER_THREAD))
    chunk = cb.sdiv(cb.add(ir.Constant(I64, s.extent - 1), per), per)
    n_chunks = cb.sdiv(cb.add(ir.Constant(I64, s.extent - 1), chunk), chunk)
    claim = child.fn.append_basic_block("claim")
    body = child.fn.append_basic_block("chunk")
    done = child.fn.append_basic_block("chunks_done")
    cb.branch(claim)
    cb.position_at_end(claim)
    c = cb.atomic_rmw("add", counter, ir.Constant(I64, 1), "monotonic")
    cb.cbranch(cb.icmp_signed("<", c, n_chunks), body, done)
    cb.position_at_end(body)
    lo = cb.mul(c, chunk)
    end = cb.add(lo, chunk)
    extent = ir.Constant(I64, s.extent)
    hi = cb.select(cb.icmp_signed("<", end, extent), end, extent)
    child.emit_serial_loop(s.var, lo, hi, s.body, timed=s if mb.region_clock is not None else None)
    if mb.checks:   # once a thread's index check failed, the others take no further chunk
        reported = cb.load_atomic(child.status_ptr, "monotonic", 4, typ=I32)
        cb.cbranch(cb.icmp_signed("!=", reported, ir.Constant(I32, KERNEL_OK)), done, claim)
    else:
        cb.branch(claim)
    cb.position_at_end(done)


def parallel_team_cap(loop: For) -> int:
    """The most threads parallel `loop` may use: one per iteration, and one per
    MIN_WORK_PER_THREAD units of the whole loop's work (_work; at least one)."""
    return max(1, min(loop.extent, int(loop.extent * _work(loop.body)) // MIN_WORK_PER_THREAD))


def _work(s: Stmt, vec_var: Var | None = None, ranges: dict | None = None) -> float:
    """Work of one run of `s` in stored elements (loops multiplied out, vector lanes counted,
    the longer branch of an if); an accumulator's update (a store of a value that reads the
    element it writes: one multiply-add in registers) counts ACCUMULATE_WORK, an element gathered
    along the vector loop `vec_var` (a load that does not step by one with it, `ranges` the
    enclosing loops' bounds) GATHER_WORK. A batch-1 layer of 784 x 512 multiply-adds then takes
    6 threads (onnxruntime's GEMM, one per 64K multiply-adds plus one, gives it 7), an
    elementwise kernel one thread per 16K elements, a channel shuffle one per 2.7K."""
    ranges = ranges or {}
    if isinstance(s, For):
        inner = {**ranges, s.var: (0, s.extent - 1)}
        return s.extent * _work(s.body, s.var if s.kind == "vectorized" else vec_var, inner)
    if isinstance(s, Seq):
        return sum(_work(c, vec_var, ranges) for c in s.stmts)
    if isinstance(s, (Allocate, LetStmt)):
        return _work(s.body, vec_var, ranges)
    if isinstance(s, IfThenElse):
        return max(_work(s.then, vec_var, ranges), _work(s.else_, vec_var, ranges) if s.else_ is not None else 0.0)
    if isinstance(s, Store):
        loads = [n for n in walk(s.value) if isinstance(n, Load)]
        if any(n.buffer is s.buffer for n in loads):
            return ACCUMULATE_WORK
        if vec_var is not None and any(vec_var in _free_vars(n.index) and not arith.unit_step(n.index, vec_var, ranges)
                                       for n in loads):
            return GATHER_WORK
        return 1.0
    return 0.0
