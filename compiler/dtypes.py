"""The dtypes the compiler supports and how they combine."""

from .errors import DTypeError

FLOAT_DTYPES = ("float32", "float64")
INT_DTYPES = ("int8", "int32", "int64")
ALL_DTYPES = FLOAT_DTYPES + INT_DTYPES + ("bool",)

_BITS = {"float32": 32, "float64": 64, "int8": 8, "int32": 32, "int64": 64, "bool": 1}


def check_dtype(dtype) -> str:
    """Return the canonical dtype name, or raise DTypeError for anything unsupported."""
    name = str(getattr(dtype, "name", dtype))
    if name not in ALL_DTYPES:
        raise DTypeError(f"unsupported dtype {name!r}; supported: {', '.join(ALL_DTYPES)}")
    return name


def is_float(dtype: str) -> bool:
    return dtype in FLOAT_DTYPES


def is_int(dtype: str) -> bool:
    return dtype in INT_DTYPES


def bits(dtype: str) -> int:
    return _BITS[dtype]


def nbytes(dtype: str) -> int:
    return 1 if dtype == "bool" else _BITS[dtype] // 8


def int_range(dtype: str) -> tuple:
    """(lowest, highest) value of an integer dtype."""
    bits_ = _BITS[dtype]
    return -(1 << (bits_ - 1)), (1 << (bits_ - 1)) - 1
