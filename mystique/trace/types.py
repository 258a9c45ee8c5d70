"""ET type strings: element dtypes of tensors and the structure of list types.

The execution trace observer writes a type string per argument: ``Tensor(float)``,
``GenericList[Tensor(float),Int]``, ``Tuple[String,String]``, ``Int``, ``None``, ...  The
element name inside ``Tensor(...)`` is the C++ type name of the scalar type as the compiler
spells it (``c10::demangle`` of the type), so it depends on the platform (``long int`` on Linux,
``long long`` on Windows) and on the torch version (``long`` appears in 1.1.x traces written by
the chakra-era observer).

:data:`DTYPE_OF_ELEMENT` maps every element spelling found in the five reference traces and in
what torch 2.13 writes for every dtype (captured with ``ExecutionTraceObserver``) to the torch
dtype name. This module needs no torch.
"""

from __future__ import annotations

import re
from functools import lru_cache

# C++ element spelling -> torch dtype name (``str(torch.float32)[6:]``).
DTYPE_OF_ELEMENT: dict[str, str] = {
    "float": "float32",
    "double": "float64",
    "c10::Half": "float16",
    "c10::BFloat16": "bfloat16",
    "long int": "int64",
    "long": "int64",
    "long long": "int64",
    "long long int": "int64",
    "int64_t": "int64",
    "int": "int32",
    "short int": "int16",
    "short": "int16",
    "signed char": "int8",
    "unsigned char": "uint8",
    "short unsigned int": "uint16",
    "unsigned short": "uint16",
    "unsigned int": "uint32",
    "long unsigned int": "uint64",
    "unsigned long": "uint64",
    "long long unsigned int": "uint64",
    "unsigned long long": "uint64",
    "bool": "bool",
    "c10::complex<c10::Half>": "complex32",
    "c10::complex<float>": "complex64",
    "c10::complex<double>": "complex128",
    "c10::Float8_e4m3fn": "float8_e4m3fn",
    "c10::Float8_e5m2": "float8_e5m2",
    "c10::Float8_e4m3fnuz": "float8_e4m3fnuz",
    "c10::Float8_e5m2fnuz": "float8_e5m2fnuz",
    "c10::Float8_e8m0fnu": "float8_e8m0fnu",
    "c10::Float4_e2m1fn_x2": "float4_e2m1fn_x2",
    "c10::qint8": "qint8",
    "c10::quint8": "quint8",
    "c10::qint32": "qint32",
    "c10::quint4x2": "quint4x2",
    "c10::quint2x4": "quint2x4",
    "c10::bits1x8": "bits1x8",
    "c10::bits2x4": "bits2x4",
    "c10::bits4x2": "bits4x2",
    "c10::bits8": "bits8",
    "c10::bits16": "bits16",
    # an undefined tensor (e.g. an absent optional gradient): no storage, no dtype
    "nullptr (uninitialized)": "undefined",
}

# Canonical spelling torch 2.13 on Linux writes for each dtype (the encoder's choice).
ELEMENT_OF_DTYPE: dict[str, str] = {
    "float32": "float",
    "float64": "double",
    "float16": "c10::Half",
    "bfloat16": "c10::BFloat16",
    "int64": "long int",
    "int32": "int",
    "int16": "short int",
    "int8": "signed char",
    "uint8": "unsigned char",
    "uint16": "short unsigned int",
    "uint32": "unsigned int",
    "uint64": "long unsigned int",
    "bool": "bool",
    "complex32": "c10::complex<c10::Half>",
    "complex64": "c10::complex<float>",
    "complex128": "c10::complex<double>",
    "float8_e4m3fn": "c10::Float8_e4m3fn",
    "float8_e5m2": "c10::Float8_e5m2",
    "float8_e4m3fnuz": "c10::Float8_e4m3fnuz",
    "float8_e5m2fnuz": "c10::Float8_e5m2fnuz",
    "float8_e8m0fnu": "c10::Float8_e8m0fnu",
    "float4_e2m1fn_x2": "c10::Float4_e2m1fn_x2",
    "qint8": "c10::qint8",
    "quint8": "c10::quint8",
    "qint32": "c10::qint32",
    "quint4x2": "c10::quint4x2",
    "quint2x4": "c10::quint2x4",
    "bits1x8": "c10::bits1x8",
    "bits2x4": "c10::bits2x4",
    "bits4x2": "c10::bits4x2",
    "bits8": "c10::bits8",
    "bits16": "c10::bits16",
    "undefined": "nullptr (uninitialized)",
}

# torch's sub-byte integer dtypes print as c10::dummy_int1_7_t<N> / c10::dummy_uint1_7_t<N>
_DUMMY_INT = re.compile(r"c10::dummy_(u?)int1_7_t<(\d)>")

UNKNOWN_DTYPE = "unknown"


def dtype_of_element(element: str) -> str:
    """Return the torch dtype name of a ``Tensor(...)`` element spelling.

    ``"float"`` -> ``"float32"``; ``"nullptr (uninitialized)"`` -> ``"undefined"``; a spelling
    this table does not know -> ``"unknown"`` (the raw type string stays on the :class:`Arg`).
    """
    element = element.strip()
    found = DTYPE_OF_ELEMENT.get(element)
    if found is not None:
        return found
    m = _DUMMY_INT.fullmatch(element)
    if m:
        return f"{m.group(1)}int{m.group(2)}"
    return UNKNOWN_DTYPE


def element_of_dtype(dtype: str) -> str:
    """Return the element spelling torch 2.13 (Linux) writes for a torch dtype name."""
    if dtype in ELEMENT_OF_DTYPE:
        return ELEMENT_OF_DTYPE[dtype]
    m = re.fullmatch(r"(u?)int([1-7])", dtype)
    if m:
        return f"c10::dummy_{m.group(1)}int1_7_t<{m.group(2)}>"
    raise ValueError(f"no ET spelling known for dtype {dtype!r}")


def tensor_type(dtype: str) -> str:
    """Return the ET type string of a tensor of ``dtype``: ``"float32"`` -> ``"Tensor(float)"``."""
    return f"Tensor({element_of_dtype(dtype)})"


def split_top_level(body: str) -> list[str]:
    """Split ``"A,B[C,D],Tensor(x)"`` at the commas that are not nested in brackets."""
    parts: list[str] = []
    depth = 0
    start = 0
    for i, ch in enumerate(body):
        if ch in "[(<":
            depth += 1
        elif ch in "])>":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(body[start:i].strip())
            start = i + 1
    tail = body[start:].strip()
    if tail or parts:
        parts.append(tail)
    return parts


@lru_cache(maxsize=4096)
def parse_type(type_str: str) -> tuple[str, str | None, tuple[str, ...] | None]:
    """Decompose an ET type string.

    Returns ``(kind, dtype, element_types)``:

    - ``"Tensor(c10::Half)"`` -> ``("Tensor", "float16", None)``
    - ``"GenericList[Tensor(float),Int]"`` -> ``("GenericList", None, ("Tensor(float)", "Int"))``
    - ``"Tuple[String,String]"`` -> ``("Tuple", None, ("String", "String"))``
    - ``"Int"`` -> ``("Int", None, None)``; ``"GenericList[]"`` -> ``("GenericList", None, ())``

    Raises ``ValueError`` for unbalanced brackets.
    """
    t = type_str.strip()
    if t.startswith("Tensor(") and t.endswith(")"):
        return "Tensor", dtype_of_element(t[len("Tensor("):-1]), None
    if t == "Tensor":
        return "Tensor", UNKNOWN_DTYPE, None
    lb = t.find("[")
    if lb >= 0:
        if not t.endswith("]"):
            raise ValueError(f"unbalanced brackets in type {type_str!r}")
        return t[:lb], None, tuple(split_top_level(t[lb + 1:-1]))
    if "(" in t or ")" in t or "]" in t:
        raise ValueError(f"unbalanced brackets in type {type_str!r}")
    return t, None, None


def list_type(element_types: list[str], kind: str = "GenericList") -> str:
    """Return the ET type string of a list of elements: ``["Int", "Int"]`` -> ``GenericList[Int,Int]``."""
    return f"{kind}[{','.join(element_types)}]"
