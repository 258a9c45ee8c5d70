"""Which outputs of an operator have defined semantics, and how each of the others is compared.

Some operators return, besides their result, what their own backward kernel wants kept: the bag
of every index (``embedding_bag``), batch statistics in the backend's accumulation dtype, a
log-sum-exp in the attention kernel's layout, a random generator's state, cuDNN's workspace.
Their shapes, dtypes and contents are the backend's business: a healthy CUDA device returns
``offset2bag`` with one entry per index where the CPU returns an empty tensor. Comparing them
reports false divergences; ignoring every auxiliary output would let wrong results through.

:data:`TABLE` is the one list of such outputs, each :class:`Rule` with its reason. A rule's
``action`` is

* ``exclude``: not compared (the detail of the op's rows names the output and why);
* ``reference dtype``: defined values in a backend-specific dtype (batch and row statistics):
  the target's output is rounded to the reference's dtype, then judged like any output;
* ``selected values``: indices whose choice among equal elements is unspecified (ties of a max
  pool or a sort): each index is replaced by the input value it selects, and those values must
  be bit-identical (an index out of range, or pointing at another value, still fails).

A rule may hold only for some arguments (``when``, described by ``condition``); every output no
rule claims is compared as before, and an operator absent from the table has every output
compared. Random draws are not compared at all (:func:`random_draw`), except where the arguments
make them deterministic (dropout with ``p = 0`` or in eval mode).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from mystique.replay.runtime import flatten_result as flatten

EXCLUDE = "exclude"
REFERENCE_DTYPE = "reference dtype"
SELECTED = "selected values"
ACTIONS = (EXCLUDE, REFERENCE_DTYPE, SELECTED)

# Operators whose results are random draws (never compared: their outputs feed later ops as drawn on
# the reference device, so nothing downstream depends on the draw); DROPOUTS are deterministic when
# ``p == 0`` or ``train`` is false (``_dropout_impl`` returns the input, native_dropout an all-true mask).
RANDOM_OPS = frozenset({
    "dropout", "native_dropout", "feature_dropout", "alpha_dropout", "feature_alpha_dropout", "_fused_dropout",
    "bernoulli", "rand", "rand_like", "randn", "randn_like", "randint", "randint_like", "randperm",
    "multinomial", "normal", "uniform", "exponential", "cauchy", "log_normal", "geometric", "random",
    "rrelu", "rrelu_with_noise", "poisson", "_standard_gamma", "_sample_dirichlet", "binomial",
})
DROPOUTS = frozenset({"dropout", "native_dropout", "feature_dropout", "alpha_dropout", "feature_alpha_dropout"})


@dataclass(frozen=True)
class Rule:
    """How outputs ``outputs`` (positions in the op's returns, named ``names``) are compared."""

    outputs: tuple[int, ...]
    names: tuple[str, ...]
    action: str
    reason: str
    when: Callable[[dict[str, Any]], bool] | None = None  # on the bound arguments; None: always
    condition: str = ""  # ``when`` in words ("mode sum or mean")
    select: Callable[[torch.Tensor, dict[str, Any]], torch.Tensor] | None = None  # SELECTED: index -> values

    def applies(self, bound: dict[str, Any]) -> bool:
        if self.when is None:
            return True
        try:
            return bool(self.when(bound))
        except (KeyError, TypeError, ValueError):
            return False


@dataclass(frozen=True)
class Entry:
    """The rules of a family of operators (aten base names: no namespace, overload or ``_`` suffix)."""

    ops: frozenset[str]
    rules: tuple[Rule, ...]
    source: str  # where the backends' behaviour is stated


# ----------------------------------------------------------------------------------------------
# Selected values: an index tensor -> the input values it selects, as int64 bit patterns, with a
# status row (0 selected, 1 nothing to select, 2 out of range) so that both sides compare exactly.


def _as_bits(values: torch.Tensor, status: torch.Tensor) -> torch.Tensor:
    v = values.detach().to(device="cpu", dtype=torch.float64).masked_fill(status != 0, 0.0)
    return torch.stack([status.to(torch.int64), v.view(torch.int64)])


def _gather_along(source: torch.Tensor, dim: int, index: torch.Tensor) -> torch.Tensor:
    src = source.detach().cpu()
    idx = index.detach().cpu().to(torch.int64)
    if src.dim() == 0:
        src, idx = src.reshape(1), idx.reshape(1)
    d = dim % src.dim()
    n = src.size(d)
    bad = (idx < 0) | (idx >= n)
    vals = src.gather(d, idx.clamp(0, max(n - 1, 0))) if n else torch.zeros(idx.shape, dtype=src.dtype)
    return _as_bits(vals.reshape(index.shape), bad.to(torch.int64).mul(2).reshape(index.shape))


def _select_along_dim(keepdim_default: bool | None) -> Callable[[torch.Tensor, dict[str, Any]], torch.Tensor]:
    """Indices along ``dim`` of ``self`` (sort, topk: same rank; kthvalue, median, mode: ``keepdim``)."""

    def select(index: torch.Tensor, b: dict[str, Any]) -> torch.Tensor:
        src = b["self"]
        dim = int(b.get("dim", -1))
        idx = index
        keep = b.get("keepdim", keepdim_default)
        if keep is False and src.dim() > 0:
            idx = index.unsqueeze(dim % src.dim())
        out = _gather_along(src, dim, idx)
        return out.reshape(2, *index.shape)

    return select


def _select_sorted(index: torch.Tensor, b: dict[str, Any]) -> torch.Tensor:
    """topk(sorted=False) indices: the selected values in ascending order along ``dim``."""
    src = b["self"].detach().cpu()
    dim = int(b.get("dim", -1))
    if src.dim() == 0:
        return _gather_along(src, 0, index)
    bits = _gather_along(src, dim, index)
    vals = src.gather(dim % src.dim(), index.detach().cpu().to(torch.int64).clamp(0, max(src.size(dim) - 1, 0)))
    order = vals.to(torch.float64).sort(dim=dim % src.dim(), stable=True).indices
    return torch.stack([bits[0].gather(dim % src.dim(), order), bits[1].gather(dim % src.dim(), order)])


def _sorted_values(values: torch.Tensor, b: dict[str, Any]) -> torch.Tensor:
    """topk(sorted=False) values: in ascending order along ``dim`` (their order is unspecified)."""
    v = values.detach().cpu()
    if v.dim() == 0:
        return _as_bits(v, torch.zeros((), dtype=torch.int64))
    s = v.to(torch.float64).sort(dim=int(b.get("dim", -1)) % v.dim(), stable=True).values
    return _as_bits(s, torch.zeros(s.shape, dtype=torch.int64))


def _select_pool(nd: int) -> Callable[[torch.Tensor, dict[str, Any]], torch.Tensor]:
    """Max-pool indices: flat positions in each (N, C) plane of ``self``'s last ``nd`` dimensions."""

    def select(index: torch.Tensor, b: dict[str, Any]) -> torch.Tensor:
        src = b["self"].detach().cpu()
        plane = src.flatten(start_dim=src.dim() - nd) if nd > 1 else src
        idx = index.detach().cpu().to(torch.int64)
        flat = idx.flatten(start_dim=idx.dim() - nd) if nd > 1 else idx
        return _gather_along(plane, -1, flat).reshape(2, *index.shape)

    return select


def _embedding_bag_padding(b: dict[str, Any]) -> int:
    pad = b.get("padding_idx")
    weight = b["weight"]
    if pad is None:
        return -1
    pad = int(pad)
    if pad < 0 and b.get("_composite"):  # embedding_bag.padding_idx wraps -1 to the last row
        pad += int(weight.size(0))
    return pad


def _select_embedding_bag_max(index: torch.Tensor, b: dict[str, Any]) -> torch.Tensor:
    """max_indices [numBags, D]: weight[index, d]; bags without a non-padding index: nothing."""
    weight = b["weight"].detach().cpu()
    ind = b["indices"].detach().cpu().to(torch.int64).reshape(-1)
    off = b["offsets"].detach().cpu().to(torch.int64).reshape(-1)
    nbags = off.numel() - (1 if b.get("include_last_offset") else 0)
    idx = index.detach().cpu().to(torch.int64)
    if idx.dim() != 2 or idx.size(0) != nbags or nbags < 0:
        return idx  # not [numBags, D]: compared as is (a shape that differs from the reference's fails)
    bag = torch.searchsorted(off[1:nbags].contiguous(), torch.arange(ind.numel()), right=True)
    real = (ind != _embedding_bag_padding(b)).to(torch.int64)
    counts = torch.zeros(nbags, dtype=torch.int64).index_add_(0, bag, real) if nbags else torch.zeros(0, dtype=torch.int64)
    rows = weight.size(0)
    status = torch.where((idx < 0) | (idx >= rows), 2, 0)
    status = torch.where((counts == 0).unsqueeze(1).expand_as(idx), 1, status)
    cols = torch.arange(idx.size(1)).expand_as(idx)
    vals = weight[idx.clamp(0, max(rows - 1, 0)), cols] if rows else torch.zeros(idx.shape)
    return _as_bits(vals, status)


# ----------------------------------------------------------------------------------------------
# The table


def _training(b: dict[str, Any]) -> bool:
    return bool(b.get("training", True))


def _no_update_training(b: dict[str, Any]) -> bool:  # _batch_norm_no_update: batch stats without running ones
    return b.get("running_mean") is None


_SAVED_STATS = ("the batch mean and inverse std kept for the backward, in the backend's dtype (the parameters' "
                "on the CPU, float32 for half inputs on CUDA, cuDNN and MIOpen)")
_NOT_IN_EVAL = "not computed in eval mode (empty tensors on the CPU, backend-defined elsewhere)"
_RESERVE = "cuDNN's opaque workspace for its own backward (empty on other backends)"
_LSE = ("the per-row log-sum-exp kept for the kernel's own backward, in its own layout (the memory-efficient "
        "kernel pads query rows to a multiple of 32; no CPU kernel returns the same)")
_VARLEN = "variable-length bookkeeping of nested inputs: undefined tensors or plain lengths for dense inputs"
_RNG = "the dropout generator's seed and offset: random state, not a result"
_DEBUG_MASK = "the dropout mask kept only with return_debug_mask: random and kernel-specific"
_TIES = "which of equal elements the index points at is unspecified"
_TRAINING_STATS = (
    Rule((1, 2), ("save_mean", "save_invstd"), REFERENCE_DTYPE, _SAVED_STATS, when=_training, condition="training"),
    Rule((1, 2), ("save_mean", "save_invstd"), EXCLUDE, _NOT_IN_EVAL, when=lambda b: not _training(b),
         condition="eval"),
)

TABLE: tuple[Entry, ...] = (
    Entry(
        frozenset({"embedding_bag", "_embedding_bag", "_embedding_bag_forward_only"}),
        (
            Rule((1,), ("offset2bag",), EXCLUDE,
                 "empty on the CPU's fast sum path (its backward rebuilds it), one bag per index on CUDA"),
            Rule((2,), ("bag_size",), EXCLUDE,
                 "zeros on the CPU in mode sum, counts over len(offsets) entries on CUDA"),
            Rule((3,), ("max_indices",), EXCLUDE,
                 "unused outside mode max: a copy of bag_size on the CPU, empty on CUDA",
                 when=lambda b: int(b.get("mode", 0)) != 2, condition="mode sum or mean"),
            Rule((3,), ("max_indices",), SELECTED,
                 "the row each maximum came from (it routes the gradient): equal rows may be chosen either way; "
                 "bags without an index (0 on the CPU, -1 on CUDA) are not compared",
                 when=lambda b: int(b.get("mode", 0)) == 2, condition="mode max", select=_select_embedding_bag_max),
        ),
        "aten/src/ATen/native/EmbeddingBag.cpp (make_offset2bag_out, make_bag_size_out, _embedding_bag_cpu_impl_out) "
        "vs aten/src/ATen/native/cuda/EmbeddingBag.cu (_embedding_bag_cuda)",
    ),
    Entry(
        frozenset({"native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_functional",
                   "miopen_batch_norm"}),
        _TRAINING_STATS,
        "aten/src/ATen/native/Normalization.cpp (batch_norm_cpu) vs cuda/Normalization.cuh (acc_type statistics)",
    ),
    Entry(
        frozenset({"cudnn_batch_norm"}),
        (*_TRAINING_STATS, Rule((3,), ("reserve",), EXCLUDE, _RESERVE)),
        "aten/src/ATen/native/cudnn/BatchNorm.cpp (cudnn_batch_norm)",
    ),
    Entry(
        frozenset({"_batch_norm_impl_index"}),
        (*_TRAINING_STATS, Rule((3,), ("reserve",), EXCLUDE, _RESERVE),
         Rule((4,), ("impl_index",), EXCLUDE, "which backend ran (0 native, 1 cuDNN, 2 MIOpen)")),
        "aten/src/ATen/native/Normalization.cpp (_batch_norm_impl_index)",
    ),
    Entry(
        frozenset({"_batch_norm_with_update"}),
        (Rule((1, 2), ("save_mean", "save_invstd"), REFERENCE_DTYPE, _SAVED_STATS),
         Rule((3,), ("reserve",), EXCLUDE, _RESERVE)),
        "aten/src/ATen/native/Normalization.cpp (_batch_norm_with_update_cpu), cudnn/BatchNorm.cpp",
    ),
    Entry(
        frozenset({"_batch_norm_no_update"}),
        (Rule((1, 2), ("save_mean", "save_invstd"), REFERENCE_DTYPE, _SAVED_STATS, when=_no_update_training,
              condition="no running statistics"),
         Rule((1, 2), ("save_mean", "save_invstd"), EXCLUDE, _NOT_IN_EVAL,
              when=lambda b: not _no_update_training(b), condition="running statistics given"),
         Rule((3,), ("reserve",), EXCLUDE, _RESERVE)),
        "aten/src/ATen/native/Normalization.cpp (_batch_norm_no_update)",
    ),
    Entry(
        frozenset({"_native_batch_norm_legit_no_training"}),
        (Rule((1, 2), ("save_mean", "save_invstd"), EXCLUDE, _NOT_IN_EVAL),),
        "aten/src/ATen/native/Normalization.cpp (_native_batch_norm_legit_no_training)",
    ),
    Entry(
        frozenset({"native_layer_norm", "native_group_norm"}),
        (Rule((1, 2), ("mean", "rstd"), REFERENCE_DTYPE,
              "the row statistics kept for the backward, in the backend's dtype (the parameters' on the CPU, "
              "float32 for half inputs on CUDA)"),),
        "aten/src/ATen/native/layer_norm.cpp vs cuda/layer_norm_kernel.cu (acc_type mean and rstd)",
    ),
    Entry(
        frozenset({"_fused_rms_norm"}),
        (Rule((1,), ("rstd",), REFERENCE_DTYPE,
              "the inverse RMS kept for the backward, in the backend's accumulation dtype"),),
        "aten/src/ATen/native/layer_norm.cpp (_fused_rms_norm)",
    ),
    Entry(
        frozenset({"_scaled_dot_product_flash_attention", "_scaled_dot_product_cudnn_attention",
                   "_scaled_dot_product_fused_attention_overrideable", "_cudnn_attention_forward"}),
        (Rule((1,), ("logsumexp",), EXCLUDE, _LSE),
         Rule((2, 3, 4, 5), ("cum_seq_q", "cum_seq_k", "max_q", "max_k"), EXCLUDE, _VARLEN),
         Rule((6, 7), ("philox_seed", "philox_offset"), EXCLUDE, _RNG),
         Rule((8,), ("debug_attn_mask",), EXCLUDE, _DEBUG_MASK)),
        "aten/src/ATen/native/transformers/cuda/attention.cu; native_functions.yaml",
    ),
    Entry(
        frozenset({"_scaled_dot_product_efficient_attention"}),
        (Rule((1,), ("log_sumexp",), EXCLUDE, _LSE),
         Rule((2, 3), ("philox_seed", "philox_offset"), EXCLUDE, _RNG)),
        "aten/src/ATen/native/transformers/cuda/attention.cu",
    ),
    Entry(
        frozenset({"_efficient_attention_forward"}),
        (Rule((1,), ("logsumexp",), EXCLUDE, _LSE),
         Rule((2, 3), ("philox_seed", "philox_offset"), EXCLUDE, _RNG),
         Rule((4, 5), ("max_seqlen_batch_q", "max_seqlen_batch_k"), EXCLUDE, _VARLEN)),
        "aten/src/ATen/native/transformers/cuda/attention.cu",
    ),
    Entry(
        frozenset({"_flash_attention_forward"}),
        (Rule((1,), ("softmax_logsumexp",), EXCLUDE, _LSE),
         Rule((2, 3), ("rng_state", "unused"), EXCLUDE, _RNG),
         Rule((4,), ("debug_attn_mask",), EXCLUDE, _DEBUG_MASK)),
        "aten/src/ATen/native/transformers/cuda/attention.cu",
    ),
    Entry(
        frozenset({"_scaled_dot_product_flash_attention_for_cpu"}),
        (Rule((1,), ("logsumexp",), EXCLUDE, _LSE),),
        "aten/src/ATen/native/transformers/attention.cpp",
    ),
    Entry(
        frozenset({"_cudnn_rnn", "miopen_rnn"}),
        (Rule((3,), ("reserve",), EXCLUDE, "the RNN library's opaque workspace for its own backward"),
         Rule((4,), ("weight_buf",), EXCLUDE, "the weights packed in the library's own layout")),
        "aten/src/ATen/native/cudnn/RNN.cpp, miopen/RNN_miopen.cpp",
    ),
    Entry(
        frozenset({"_thnn_fused_lstm_cell"}),
        (Rule((2,), ("workspace",), EXCLUDE, "the fused kernel's gate workspace kept for its own backward"),),
        "aten/src/ATen/native/cuda/RNN.cu",
    ),
    Entry(
        frozenset({"_thnn_fused_gru_cell"}),
        (Rule((1,), ("workspace",), EXCLUDE, "the fused kernel's gate workspace kept for its own backward"),),
        "aten/src/ATen/native/cuda/RNN.cu",
    ),
    *(Entry(frozenset({name}), (Rule((1,), ("indices",), SELECTED,
                                     f"the position of a maximum of each window: {_TIES}",
                                     select=_select_pool(nd)),),
            "torch.nn.MaxPool*d(return_indices=True) docs; aten/src/ATen/native/*Pool*")
      for name, nd in (("max_pool1d_with_indices", 1), ("max_pool2d_with_indices", 2), ("max_pool3d_with_indices", 3),
                       ("adaptive_max_pool1d", 1), ("adaptive_max_pool2d", 2), ("adaptive_max_pool3d", 3),
                       ("fractional_max_pool2d", 2), ("fractional_max_pool3d", 3))),
    Entry(
        frozenset({"sort"}),
        (Rule((1,), ("indices",), SELECTED,
              f"{_TIES} unless stable=True", select=_select_along_dim(None),
              when=lambda b: not b.get("stable"), condition="stable is not True"),),
        "torch.sort docs (stable: 'preserving the order of equivalent elements')",
    ),
    Entry(
        frozenset({"topk"}),
        (Rule((1,), ("indices",), SELECTED, _TIES,
              select=_select_along_dim(None), when=lambda b: b.get("sorted", True) is not False, condition="sorted"),
         Rule((0,), ("values",), SELECTED, "the order of unsorted results is unspecified: compared sorted",
              select=_sorted_values, when=lambda b: b.get("sorted", True) is False, condition="sorted=False"),
         Rule((1,), ("indices",), SELECTED,
              f"{_TIES}, and the order of unsorted results too: compared sorted",
              select=_select_sorted, when=lambda b: b.get("sorted", True) is False, condition="sorted=False")),
        "torch.topk docs",
    ),
    Entry(
        frozenset({"kthvalue", "median", "nanmedian", "mode"}),
        (Rule((1,), ("indices",), SELECTED,
              f"{_TIES} ('device-specific', torch.median docs)",
              select=_select_along_dim(False)),),
        "torch.median / torch.kthvalue / torch.mode docs",
    ),
)


def base_op_name(name: str) -> str:
    """``aten::bernoulli_.float`` -> ``bernoulli`` (namespace, overload and in-place mark removed)."""
    n = name.split("::", 1)[-1].split(".", 1)[0]
    return n[:-1] if n.endswith("_") and not n.endswith("__") else n


def _namespace(name: str) -> str:
    return name.split("::", 1)[0] if "::" in name else "aten"


_BY_OP: dict[str, Entry] = {op: e for e in TABLE for op in e.ops}


def entry(name: str) -> Entry | None:
    """The :class:`Entry` of an operator name (``aten::embedding_bag.padding_idx``), or None."""
    if _namespace(name) != "aten":
        return None
    return _BY_OP.get(base_op_name(name))


def random_draw(name: str, bound: dict[str, Any] | None = None) -> bool:
    """Whether ``name`` called with ``bound`` arguments draws random numbers (its results are then
    never compared). Dropouts with ``p == 0`` or ``train`` false are deterministic."""
    if _namespace(name) != "aten":
        return False
    base = base_op_name(name)
    if base not in RANDOM_OPS:
        return False
    if base in DROPOUTS and bound is not None:
        p, train = bound.get("p"), bound.get("train", True)
        if train is False or (isinstance(p, (int, float)) and float(p) == 0.0):
            return False
    return True


# ----------------------------------------------------------------------------------------------
# Binding a call to its schema


def _literal(text: str | None) -> Any:
    if text is None:
        return None
    t = text.strip()
    if t in ("True", "False"):
        return t == "True"
    if t == "None":
        return None
    for conv in (int, float):
        try:
            return conv(t)
        except ValueError:
            pass
    return t.strip("'\"")


def bind(schema: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The arguments of a call by schema name (``schema``: a parsed :class:`~mystique.replay.runtime.Schema`),
    defaults filled in from the schema text."""
    bound: dict[str, Any] = {}
    if schema is None:
        return bound
    pos = list(args)
    for a in schema.args:
        if not a.kwarg_only and pos:
            bound[a.name] = pos.pop(0)
        elif a.name in kwargs:
            bound[a.name] = kwargs[a.name]
        elif a.default is not None:
            bound[a.name] = _literal(a.default)
    return bound


_ALIAS = re.compile(r"\(([a-z]+)!?\)")


def _returns(schema: Any) -> list[str]:
    text = (getattr(schema, "returns", "") or "").strip()
    if text.startswith("(") and text.endswith(")"):
        text = text[1:-1]
    out, depth, cur = [], 0, ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur.strip())
    return out


def return_positions(schema: Any, result: Any, mutated: Sequence[tuple[Any, bool]], args: Sequence[Any],
                     kwargs: dict[str, Any]) -> list[int | None]:
    """For every value :func:`.engine.observe` lists (the flattened result, then the written
    arguments), the position in the schema's returns it is (None: a written argument no return aliases)."""
    rets = _returns(schema)
    out: list[int | None] = []
    if isinstance(result, (tuple, list)) and (len(rets) != 1 or isinstance(result, tuple)):
        for i, r in enumerate(result):
            out.extend([i] * len(flatten(r)))
    else:
        out.extend([0] * len(flatten(result)))
    aliases = {}
    for i, r in enumerate(rets):
        m = _ALIAS.search(r)
        if m and "!" in r:
            aliases[m.group(1)] = i
    by_name = {a.name: a for a in getattr(schema, "args", ())}
    positional = [a for a in getattr(schema, "args", ()) if not a.kwarg_only]
    for key, _is_list in mutated:
        arg = positional[key] if isinstance(key, int) and key < len(positional) else by_name.get(key)
        value = (args[key] if key < len(args) else None) if isinstance(key, int) else kwargs.get(key)
        m = _ALIAS.search(arg.type) if arg is not None else None
        out.extend([aliases.get(m.group(1)) if m else None] * len(flatten(value)))
    return out


# ----------------------------------------------------------------------------------------------
# The rules of one call


@dataclass
class OutputPlan:
    """The rules that apply to one call: ``rules[j]`` for observed value ``j`` (None: compared as is)."""

    op: str
    rules: list[Rule | None]
    bound: dict[str, Any]
    returns: list[int | None]

    def rule(self, j: int) -> Rule | None:
        return self.rules[j] if 0 <= j < len(self.rules) else None

    def excluded(self, j: int) -> bool:
        r = self.rule(j)
        return r is not None and r.action == EXCLUDE

    def prepare(self, j: int, target: Any, reference: Any) -> tuple[Any, Any]:
        """The two values of observed output ``j`` as they are to be compared."""
        r = self.rule(j)
        if r is None or not isinstance(reference, torch.Tensor) or not isinstance(target, torch.Tensor):
            return target, reference
        if r.action == REFERENCE_DTYPE:
            if target.dtype != reference.dtype and target.dtype.is_floating_point and reference.dtype.is_floating_point:
                target = target.to(reference.dtype)
            return target, reference
        if r.action == SELECTED and r.select is not None:
            return self.canonical(j, target), self.canonical(j, reference)
        return target, reference

    def canonical(self, j: int, value: Any) -> Any:
        """One value as compared (the selected values of a SELECTED output; itself otherwise)."""
        r = self.rule(j)
        if r is None or r.action != SELECTED or r.select is None or not isinstance(value, torch.Tensor):
            return value
        try:
            return r.select(value, self.bound)
        except (RuntimeError, IndexError, KeyError, ValueError):  # not selectable: compared as is
            return value

    def note(self) -> str:
        """``outputs 1-3 of aten::embedding_bag not compared: ...`` (empty when nothing is excluded),
        plus the outputs compared otherwise than as is."""
        parts = []
        for action, verb in ((EXCLUDE, "not compared"), (REFERENCE_DTYPE, "compared in the reference's dtype"),
                             (SELECTED, "compared by the input values selected")):
            chosen: dict[int, Rule] = {}
            for j, r in enumerate(self.rules):
                if r is not None and r.action == action and self.returns[j] is not None:
                    chosen.setdefault(int(self.returns[j]), r)
            if not chosen:
                continue
            outs = sorted(chosen)
            names = []
            reasons: list[str] = []
            for o in outs:
                rule = chosen[o]
                names.append(rule.names[rule.outputs.index(o)] if o in rule.outputs else str(o))
                if rule.reason not in reasons:
                    reasons.append(rule.reason)
            label = "output" if len(outs) == 1 else "outputs"
            what = f"{'/'.join(names)} {'is' if len(outs) == 1 else 'are'} backend-specific" \
                if action == EXCLUDE else "/".join(names)
            parts.append(f"{label} {_ranges(outs)} of {self.op} {verb}: {what} ({'; '.join(reasons)})")
        return "; ".join(parts)


def _ranges(values: list[int]) -> str:
    out: list[str] = []
    start = prev = values[0]
    for v in values[1:] + [None]:  # type: ignore[list-item]
        if v is not None and v == prev + 1:
            prev = v
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if v is not None:
            start = prev = v
    return ", ".join(out)


def output_plan(name: str, schema: Any, result: Any, mutated: Sequence[tuple[Any, bool]], args: Sequence[Any],
                kwargs: dict[str, Any], display: str | None = None) -> OutputPlan | None:
    """The :class:`OutputPlan` of one call of operator ``name`` (None when no rule of :data:`TABLE` applies)."""
    e = entry(name)
    if e is None:
        return None
    bound = bind(schema, args, kwargs)
    if base_op_name(name) == "embedding_bag":
        bound["_composite"] = True
    positions = return_positions(schema, result, mutated, args, kwargs)
    rules: list[Rule | None] = []
    for pos in positions:
        chosen = None
        if pos is not None:
            chosen = next((r for r in e.rules if pos in r.outputs and r.applies(bound)), None)
        rules.append(chosen)
    if not any(r is not None for r in rules):
        return None
    return OutputPlan(display or name.split(".", 1)[0], rules, bound, positions)
