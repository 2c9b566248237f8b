"""A matmul schedule from a handful of knobs, as a trace candidate: the small hand-made search
spaces of test_features_model.py and test_search.py both build their candidates with it."""

from compiler import create_schedule
from tuner.candidate import Candidate


def matmul_knob_trace(opdef, ti, tj, tk, vec, order, unroll, par) -> Candidate:
    """Split i, j, k by ti, tj, tk; order (io, jo, ko, ki, ii, ji) or (.., ii, ki, ji); then
    optionally vectorize ji, unroll ki, parallelize io."""
    s = create_schedule(opdef.output)
    st = s[opdef.output]
    i, j = st.op.axis
    (r,) = st.op.reduce_axis
    io, ii = st.split(i, factor=ti)
    jo, ji = st.split(j, factor=tj)
    ko, ki = st.split(r, factor=tk)
    st.reorder(*((io, jo, ko, ki, ii, ji) if order else (io, jo, ko, ii, ki, ji)))
    if vec:
        st.vectorize(ji)
    if unroll:
        st.unroll(ki)
    if par:
        st.parallel(io)
    return Candidate("trace", {"steps": s.steps})
