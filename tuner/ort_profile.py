"""onnxruntime's own per-node profile of a model, and which of our kernels each of its nodes is.

`tunefarm model profile --compare` puts onnxruntime's time beside each of our fused kernels, so
the layer where we lose is found in one command. onnxruntime times its nodes itself when a
session profiles (SessionOptions.enable_profiling): a JSON trace whose `Node` events
(`<node name>_kernel_time`, `args.op_name`, `dur` in µs) fall inside one `model_run` event per
run. `profile_onnxruntime` runs the model `warmup + runs` times that way, on the given threads and
under the host's exclusive timing lock (nothing else of tunefarm runs meanwhile), reads the trace
from a temporary directory and deletes it; each node's time is its mean over the runs after the
warm-up.

Matching is by ONNX node name, since both compilers keep them where they can, but both fuse and
rename: our kernel covers several nodes (and the blocked layout's copies are named after values,
`r2/from_nchwc`); onnxruntime names a fused node after its first node with a prefix and a suffix
(`fused mm/MatMulAddFusion`) and its NCHWc convolutions after their *output value* (`r1_nchwc`:
the conv + relu whose relu writes r1). So an onnxruntime node name is tried as it is, then without
those decorations, each form as a node name of one of our kernels and as a value name whose
producing node is in one; what matches nothing (onnxruntime's own layout reorders, nodes we fold
away at compile time) is reported as unmatched time rather than guessed at.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from compiler import host_lock
from compiler.timing import TimingOptions, time_samples

INSTALL_HINT = "pip install 'tunefarm[bench]'"


class OnnxRuntimeError(Exception):
    """onnxruntime is not installed, refused the model, or wrote a profile that cannot be read."""


@dataclass
class OrtNode:
    """One node of onnxruntime's executed graph: its name there, its op type, mean seconds per run."""

    name: str
    op_type: str
    seconds: float

    def to_dict(self) -> dict:
        return {"name": self.name, "op_type": self.op_type, "ms": self.seconds * 1e3}


@dataclass
class OrtProfile:
    """onnxruntime's nodes in the order they first ran, and its mean time per run (`model_run`)."""

    nodes: list
    run_seconds: float               # mean of the profiled runs (the profiler's own cost included)
    runs: int
    plain_run_seconds: float | None = None   # median whole run of a session that does not profile

    @property
    def node_seconds(self) -> float:
        return sum(n.seconds for n in self.nodes)


@dataclass
class Matched:
    """onnxruntime's nodes per kernel of ours (`per_kernel[i]`, in our step order) and the rest."""

    per_kernel: list
    unmatched: list = field(default_factory=list)

    def kernel_seconds(self, i: int) -> float:
        return sum(n.seconds for n in self.per_kernel[i])

    @property
    def unmatched_seconds(self) -> float:
        return sum(n.seconds for n in self.unmatched)


def require_onnxruntime():
    """The onnxruntime module, imported on first use (it is in the `bench` extra, not a dependency)."""
    try:
        return importlib.import_module("onnxruntime")
    except ImportError:
        raise OnnxRuntimeError(f"comparing with onnxruntime needs the onnxruntime package: {INSTALL_HINT}") from None


def profile_onnxruntime(model_path, inputs: dict, threads: int = 0, runs: int = 10, warmup: int = 2,
                        lock: bool = True) -> OrtProfile:
    """onnxruntime's per-node profile of the model at `model_path` on `inputs`: `warmup` runs then
    `runs` profiled ones, on `threads` intra-op threads (0: its default, all cores); then the
    whole run timed again in a session that does not profile (the profiler costs a few µs per
    node, which on a small model is much of the run), by tunefarm's measurement protocol."""
    if runs < 1 or warmup < 0:
        raise ValueError(f"need runs >= 1 and warmup >= 0, got runs={runs}, warmup={warmup}")
    held = host_lock.exclusive if lock else contextlib.nullcontext
    with tempfile.TemporaryDirectory(prefix="tunefarm-ort-") as tmp:
        path = _named_model(model_path, tmp)
        try:
            session = _session(path, threads, profile_prefix=os.path.join(tmp, "profile"))
            with held():
                for _ in range(warmup + runs):
                    session.run(None, inputs)
            trace = session.end_profiling()
        except Exception as e:  # noqa: BLE001 - onnxruntime's errors have no common base we can name
            raise OnnxRuntimeError(f"onnxruntime could not run the model: {type(e).__name__}: {e}") from None
        try:
            with open(trace) as f:
                events = json.load(f)
        except (OSError, ValueError) as e:
            raise OnnxRuntimeError(f"cannot read onnxruntime's profile {trace}: {e}") from None
        finally:
            Path(trace).unlink(missing_ok=True)
        result = parse_profile(events, warmup)
        plain = _session(path, threads)

        def run_batch(n):
            for _ in range(n):
                plain.run(None, inputs)

        with held():
            plain.run(None, inputs)
            result.plain_run_seconds = time_samples(run_batch, TimingOptions(min_samples=runs)).median
    return result


def _session(path: str, threads: int, profile_prefix: str | None = None):
    """A CPU session as `tunefarm model run` makes one: `threads` intra-op threads (0: onnxruntime's
    default), one inter-op thread; profiling into `profile_prefix`* when given."""
    ort = require_onnxruntime()
    so = ort.SessionOptions()
    if profile_prefix:
        so.enable_profiling = True
        so.profile_file_prefix = profile_prefix
    if threads:
        so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def _named_model(model_path, tmp: str) -> str:
    """The model's path, or when some nodes have no name, a copy in `tmp` that names them as
    tunefarm's importer does (`{op_type}_{index}`), so both sides call them the same."""
    from compiler.graph.onnx_import import load_model
    model = load_model(model_path)
    unnamed = [(i, n) for i, n in enumerate(model.graph.node) if not n.name]
    if not unnamed:
        return str(model_path)
    for i, n in unnamed:
        n.name = f"{n.op_type}_{i}"
    path = os.path.join(tmp, "named.onnx")
    with open(path, "wb") as f:
        f.write(model.SerializeToString())
    return path


def parse_profile(events: list, warmup: int) -> OrtProfile:
    """Per-node mean seconds over the runs after the first `warmup`, from the trace's events."""
    runs = sorted((e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"),
                  key=lambda e: e["ts"])
    counted = runs[warmup:]
    if not counted:
        raise OnnxRuntimeError(f"onnxruntime's profile has {len(runs)} model runs, none after the {warmup} warm-up ones")
    windows = [(r["ts"], r["ts"] + r["dur"]) for r in counted]
    totals: dict = {}
    for e in events:
        name = e.get("name", "")
        if e.get("cat") != "Node" or not name.endswith("_kernel_time"):
            continue
        if not any(lo <= e["ts"] <= hi for lo, hi in windows):
            continue
        key = name[:-len("_kernel_time")]
        op_type, us = totals.get(key, (e.get("args", {}).get("op_name", "?"), 0.0))
        totals[key] = (op_type, us + float(e["dur"]))
    n = len(counted)
    nodes = [OrtNode(name, op_type, us / n / 1e6) for name, (op_type, us) in totals.items()]
    return OrtProfile(nodes, sum(float(r["dur"]) for r in counted) / n / 1e6, n)


_DECORATIONS = (re.compile(r"^fused "), re.compile(r"/\w*Fusion$"), re.compile(r"_nchwc$"))


def name_forms(name: str) -> list:
    """An onnxruntime node name as it is, then with its fusion and layout decorations removed."""
    forms = [name]
    for pattern in _DECORATIONS:
        name = pattern.sub("", name)
        if name and name not in forms:
            forms.append(name)
    return forms


def match_kernels(ort: OrtProfile, kernel_nodes: list, producers: dict) -> Matched:
    """Which kernel each onnxruntime node is: `kernel_nodes[i]` our kernel i's node names,
    `producers` {value name: name of the node writing it} of the graph as imported."""
    kernel_of = {name: i for i, names in enumerate(kernel_nodes) for name in names}
    out = Matched([[] for _ in kernel_nodes])
    for node in ort.nodes:
        found = None
        for form in name_forms(node.name):
            found = kernel_of.get(form)
            if found is None and form in producers:
                found = kernel_of.get(producers[form])
            if found is not None:
                break
        (out.unmatched if found is None else out.per_kernel[found]).append(node)
    return out


__all__ = ["profile_onnxruntime", "parse_profile", "match_kernels", "name_forms", "OrtProfile", "OrtNode", "Matched",
           "OnnxRuntimeError", "INSTALL_HINT", "require_onnxruntime"]
