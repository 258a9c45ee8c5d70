"""The operator policy: which operators an untrusted plan or trace may have the replay call.

A plan names the operators the replay calls, so a hostile one could name an operator that is not
computation: ``aten::from_file(path, shared=True)`` maps a file and a ``fill_`` on its result writes
into it, ``aten::save`` writes one, ``aten::manual_seed`` resets the process's generator. The policy
is derived from each operator's own schema (torch's, as this process registers it), not from a list
of bad names, so an operator that torch or a library adds later is judged by the same rules. An
operator is refused when any rule of :data:`POLICY_RULES` catches its schema:

* ``file``: it takes a file name or path (a ``str`` argument named like one of :data:`FILE_ARGS`),
  or its name says it reads or writes files (a word of :data:`FILE_WORDS`: ``from_file``, ``save``,
  ``load``, ``*_filename``);
* ``shared_memory``: it opens or shares memory with other processes (a word of
  :data:`SHARED_WORDS` in its name or argument names: ``from_file(shared=)``, ``_share_memory_``);
* ``process_state``: it sets state of the whole process rather than of its tensors: it writes a
  random-number ``Generator``, or its name is a setter (a word of :data:`SETTER_WORDS`:
  ``manual_seed``, ``set_grad_enabled``, ``_cufft_set_plan_cache_max_size``) while it returns
  nothing and writes none of its arguments;
* ``no_tensor``: it has no tensor semantics (no ``Tensor`` among its arguments or results: printing,
  warnings, assertions, list, string and dict helpers of TorchScript, setters), unless it is a pure
  function of numbers (numbers in, numbers out, nothing written: ``promote_types``, which every
  reference workload's trace holds, ``add.int``).

An optional ``Generator? generator`` argument (``normal_``, ``uniform_``) is tensor semantics: a plan
can only pass ``None`` there, so the op draws from the default generator as eager code does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

#: Argument names that hold a file name or path when their type is ``str``.
FILE_ARGS: frozenset[str] = frozenset({"filename", "file_name", "file", "path", "filepath", "file_path", "fname",
                                       "f", "dirname", "directory", "dir", "folder"})
#: Words of an operator name (split at ``_``) that say it reads or writes files.
FILE_WORDS: frozenset[str] = frozenset({"file", "filename", "save", "load", "fopen"})
#: Words of an operator or argument name that say it shares memory with other processes.
SHARED_WORDS: frozenset[str] = frozenset({"share", "shared", "shm", "ipc", "mmap"})
#: Words of an operator name that make it a setter of state.
SETTER_WORDS: frozenset[str] = frozenset({"set", "reset", "seed", "manual", "enable", "disable"})
#: Schema types of numbers (``ScalarType``, ``Layout`` and ``MemoryFormat`` read as ``int``).
NUMBER_TYPES: frozenset[str] = frozenset({"int", "float", "bool", "complex", "number", "SymInt", "SymFloat", "SymBool"})


def _op_words(name: str) -> set[str]:
    """The words of an operator name: ``aten::_share_memory_`` -> ``{"share", "memory"}``."""
    short = name.rsplit("::", 1)[-1].split(".", 1)[0]
    return {w for w in short.lower().split("_") if w}


def _type_base(t: Any) -> str:
    """A type without ``Optional[...]`` and ``List[...]`` around it: ``Optional[str]`` -> ``str``."""
    text = str(t)
    for wrapper in ("Optional[", "List["):
        while text.startswith(wrapper) and text.endswith("]"):
            text = text[len(wrapper):-1]
    return text


def _arg_written(arg: Any) -> bool:
    return arg.alias_info is not None and arg.alias_info.is_write


def file_rule(schema: Any) -> str:
    """``"takes a file name (argument 'filename')"`` when ``schema`` takes a file name or path, or its
    name says it reads or writes files; "" otherwise."""
    for a in schema.arguments:
        if a.name.lower() in FILE_ARGS and _type_base(a.type) == "str":
            return f"takes a file name (argument {a.name!r})"
    words = sorted(_op_words(schema.name) & FILE_WORDS)
    return f"reads or writes files (its name says {words[0]!r})" if words else ""


def shared_memory_rule(schema: Any) -> str:
    """Non-empty when ``schema`` opens or shares memory with other processes."""
    words = sorted(_op_words(schema.name) & SHARED_WORDS)
    if words:
        return f"opens shared memory (its name says {words[0]!r})"
    for a in schema.arguments:
        if a.name.lower() in SHARED_WORDS:
            return f"opens shared memory (argument {a.name!r})"
    return ""


def process_state_rule(schema: Any) -> str:
    """Non-empty when ``schema`` sets process-wide state: writes a Generator, or is a setter
    (:data:`SETTER_WORDS`) that returns nothing and writes none of its arguments."""
    for a in schema.arguments:
        if _type_base(a.type) == "Generator" and _arg_written(a):
            return f"sets the state of a random-number generator (argument {a.name!r})"
    words = sorted(_op_words(schema.name) & SETTER_WORDS)
    if words and not schema.returns and not any(_arg_written(a) for a in schema.arguments):
        return f"sets process-wide state (its name says {words[0]!r} and it returns nothing)"
    return ""


def _numeric_type(t: Any) -> bool:
    return _type_base(t) in NUMBER_TYPES


def no_tensor_rule(schema: Any) -> str:
    """Non-empty when ``schema`` has no ``Tensor`` among its arguments or results, unless it is a
    function of numbers: numbers in (at least one, none written), numbers out (``promote_types``,
    ``result_type.Scalar_Scalar``, ``add.int``), which can reach nothing else."""
    types = [a.type for a in schema.arguments] + [r.type for r in schema.returns]
    if any("Tensor" in str(t) for t in types):
        return ""
    if (schema.arguments and schema.returns and all(_numeric_type(t) for t in types)
            and not any(_arg_written(a) for a in schema.arguments)):
        return ""
    return "has no tensor semantics (no Tensor argument or result)"


#: ``(rule name, test)``: each test takes a ``torch.FunctionSchema`` and says why it refuses it ("" if not).
POLICY_RULES: tuple[tuple[str, Callable[[Any], str]], ...] = (
    ("file", file_rule),
    ("shared_memory", shared_memory_rule),
    ("process_state", process_state_rule),
    ("no_tensor", no_tensor_rule),
)


def schema_refusal(schema: Any) -> str:
    """Why the policy refuses an operator of ``schema`` (a ``torch.FunctionSchema`` or its text), in
    words that follow "it" (the first rule of :data:`POLICY_RULES` that catches it); "" when it may run."""
    if isinstance(schema, str):
        schema = torch._C.parse_schema(schema)
    for _name, rule in POLICY_RULES:
        why = rule(schema)
        if why:
            return why
    return ""
