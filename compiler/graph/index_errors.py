"""A model's failed index check, named by its node.

A fused group's kernel is shared by every group with its workload key, so the kernel cannot
know the ONNX node it runs for; its checks name the node by op type and position in the group
(ops.base.node_site, `Gather #0: indices`), which is structural. When a run's call sequence
stops at a kernel whose check fired, `node_error` looks the step's group up and names the
node: its ONNX name and op type, the input the index came from, the value and the valid range.
"""

from __future__ import annotations

from ..errors import KernelRuntimeError
from .ops.base import site_position


def failing_node(nodes: list, site: str):
    """The node of `nodes` (a fused group, in order) whose check has site text `site`; None when
    the site is no node's (a custom compute's read) or cannot be told apart."""
    op_type, pos = site_position(site)
    if op_type is None:
        return None
    if pos is not None and pos < len(nodes) and nodes[pos].op_type == op_type:
        return nodes[pos]
    same = [n for n in nodes if n.op_type == op_type]
    return same[0] if len(same) == 1 else None


def node_error(error: KernelRuntimeError, steps: list) -> KernelRuntimeError:
    """`error` (from a model's call sequence) restated for the node whose index check fired:
    `Gather node 'emb' (Gather): index 7 in its indices is out of range [-5, 5)`, with `node`,
    `op_type`, `check`, `value` and `call` set. Any other error comes back as it is."""
    check, call = error.check, error.call
    if check is None or call is None or not 0 <= call < len(steps):
        return error
    step = steps[call]
    node = failing_node(step.group.group.nodes, check.site)
    if node is None:
        return error
    what = check.site.split(": ", 1)[1]
    message = (f"{node.op_type} node {node.name!r}: index {error.value} in its {what} is out of range "
               f"[{check.lo}, {check.hi}) (kernel {step.kernel.name}, step {call} of {len(steps)}); "
               "the run's outputs were not returned")
    return KernelRuntimeError(message, error.status, check=check, value=error.value, node=node.name,
                              op_type=node.op_type, call=call)


__all__ = ["failing_node", "node_error"]
