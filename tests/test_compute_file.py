"""`load_compute_file`: a user's Python file defining `workload()` becomes a workload whose
definition is data; a file that cannot be used says which file, which line and why."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

from compiler.ops import get_op, random_inputs
from tuner.compute_file import load_compute_file
from tuner.workload import Workload, WorkloadError

CONV_BLOCK = """
    import compiler as C
    from compiler.ops.functions import bias_add, conv2d_nchw

    def workload():
        x = C.placeholder((1, 4, 9, 9), "float32", "x")
        w = C.placeholder((8, 4, 3, 3), "float32", "w")
        b = C.placeholder((8,), "float32", "b")
        y = bias_add(conv2d_nchw(x, w, stride=2, padding=1), b, activation="relu", name="conv_block", tag="elemwise")
        return [b, x, w, y]
"""


def write(tmp_path, text, name="block.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_a_file_returning_inputs_and_output(tmp_path):
    workload = load_compute_file(write(tmp_path, CONV_BLOCK))
    assert workload.name == "block" and workload.definition is not None
    op = workload.opdef()
    assert [t.name for t in op.inputs] == ["b", "x", "w"]  # the order the file gave
    inventory = get_op("conv2d_bias_relu", N=1, C=4, H=9, W=9, F=8, KH=3, KW=3, stride=2, padding=1)
    # the inventory's compute, with other names and argument order: the same workload key, so records
    # tuned for either apply to both
    assert op.workload_key() == inventory.workload_key()
    b, x, w = random_inputs(op, np.random.default_rng(0))
    np.testing.assert_allclose(op.reference(b, x, w), inventory.reference(x, w, b), rtol=1e-5, atol=1e-6)


def test_a_file_returning_the_output_tensor_and_its_main_block_not_run(tmp_path):
    text = """
        import compiler as C

        def workload():
            a = C.placeholder((5, 7), "float32", "a")
            return C.compute((5, 7), lambda i, j: C.sqrt(C.abs(a[i, j])) * 2.0, name="root2")

        if __name__ == "__main__":
            raise SystemExit("the main block ran")
    """
    workload = load_compute_file(write(tmp_path, text, "root2.py"))
    assert workload.name == "root2" and [t.name for t in workload.opdef().inputs] == ["a"]


def test_a_file_returning_an_inventory_opdef_is_that_operator(tmp_path):
    text = """
        from compiler.ops import get_op

        def workload():
            return get_op("dense_gelu", batch=8, in_dim=16, out_dim=32)
    """
    assert load_compute_file(write(tmp_path, text)) == Workload("dense_gelu", dict(batch=8, in_dim=16, out_dim=32,
                                                                                    dtype="float32"))


def test_a_file_may_import_its_neighbours(tmp_path):
    write(tmp_path, "SIZE = 6\n", "sizes_for_test_compute_file.py")
    text = """
        import compiler as C
        from sizes_for_test_compute_file import SIZE

        def workload():
            a = C.placeholder((SIZE,), "float32", "a")
            return C.compute((SIZE,), lambda i: a[i] + 1.0, name="inc")
    """
    assert load_compute_file(write(tmp_path, text)).opdef().output.shape == (6,)


@pytest.mark.parametrize("text,message", [
    ("def workload(:\n    pass\n", r"block\.py:1: syntax error: "),
    ("import compiler\n\n\nraise RuntimeError('no GPU here')\n",
     r"block\.py:4: running the file raised RuntimeError: no GPU here"),
    ("import sys\nsys.exit(3)\n", r"block\.py:2: running the file raised SystemExit: 3"),
    ("x = 1\n", r"block\.py defines no function workload\(\); define `def workload\(\):` returning the output"),
    ("workload = 3\n", r"defines no function workload\(\)"),
    ("import compiler as C\n\ndef workload():\n    a = C.placeholder((2,), 'float32', 'a')\n"
     "    return C.compute((2,), lambda i: a[i] + C.placeholder((2,), 'int32', 'b')[i], name='x')\n",
     r"block\.py:5: workload\(\) raised DTypeError: cannot combine float32 and int32"),
    ("def workload():\n    return {'A': 1}\n",
     r"block\.py: workload\(\) returned dict; expected the output Tensor, a list \[input, \.\.\., output\]"),
    ("def workload():\n    return []\n", r"workload\(\) returned list"),
    ("import compiler as C\n\ndef workload():\n    a = C.placeholder((2,), 'float32', 'a')\n"
     "    b = C.placeholder((2,), 'float32', 'b')\n"
     "    return [a, C.compute((2,), lambda i: a[i] * b[i], name='x')]\n",
     r"block\.py: workload block: compute definition, inputs: placeholder\(s\) b are read but not listed"),
])
def test_unusable_files_name_the_file_the_line_and_the_cause(tmp_path, text, message):
    with pytest.raises(WorkloadError, match=message):
        load_compute_file(write(tmp_path, text))


def test_missing_file_and_inventory_names(tmp_path):
    with pytest.raises(WorkloadError, match=r"cannot read compute file .*nope\.py: No such file"):
        load_compute_file(tmp_path / "nope.py")
    with pytest.raises(WorkloadError, match=r"dense\.py: the workload is named after the file, and 'dense' is an "
                                            "inventory operator; rename the file"):
        load_compute_file(write(tmp_path, CONV_BLOCK, "dense.py"))
