"""Checkpointed, resumable fault-injection campaigns and their trial functions.

A campaign is ``n_trials`` independent trials, each a pure function of ``(config, trial index)``.
Its config is everything that changes an outcome (the caller's settings: device, device model, seed,
level, trial counts, ...; the campaign adds the torch and mystique versions). Outcomes are appended as
JSON lines ``{"config": HASH, "trial": i, ...}`` to a checkpoint file named after the campaign,
``campaign_NAME.jsonl``, whose first line records the full config. Rerunning the same campaign reads
the file back, skips the trials already recorded (a trial recorded twice counts once; a truncated
last line, as left by a kill mid-write, is dropped and rerun) and runs only the missing ones, so a
resumed run has exactly the outcomes of an uninterrupted one. A checkpoint written with another
config is refused (:class:`~mystique.errors.UsageError`, exit 2, naming what differs), never reused
and never silently ignored.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

import mystique
from mystique.errors import UsageError
from mystique.faults.bits import choose_bits, flip_bits_, hash_seed
from mystique.io import atomic_write_bytes
from mystique.progress import Progress

from .abft import (
    UNIT_ROUNDOFF,
    Bags,
    CheckReport,
    FusedCall,
    QuantizedTable,
    accumulate,
    checked_embedding_bag,
    checked_linear,
    checked_mm,
    checked_quantized_embedding_bag,
    checked_table,
    encode_gemm,
    fused_table,
    prime,
    quantized_embedding_bag,
    verify_bag_output,
    verify_gemm,
)
from .abft.bag_verdict import row_sums64, sure_alarms
from .abft.gemm import sure_row_alarms
from .inject import flip_tensor

TrialFn = Callable[[int], dict[str, Any]]
SIGNIFICANCE = 2.0**-7  # a flip is significant when it moves an output by more than this x rms(output)
FP32_BAG_EXTRA, BYTE_BAG_EXTRA = 4.0, 6.0  # the `extra` roundings of the checked fp32 and 8-bit lookups


def config_hash(config: dict[str, Any]) -> str:
    """First 16 hex digits of the SHA-256 of the config's canonical JSON."""
    text = json.dumps(config, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _canonical(config: dict[str, Any]) -> dict[str, Any]:
    """The config as its JSON record reads back (tuples as lists, other objects as strings)."""
    return json.loads(json.dumps(config, sort_keys=True, default=str))


def config_differences(recorded: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """``key: RECORDED (checkpoint) vs CURRENT (this run)`` for every key whose values differ."""
    out = []
    for key in sorted(set(recorded) | set(current)):
        old, new = recorded.get(key, "<absent>"), current.get(key, "<absent>")
        if old != new:
            out.append(f"{key}: {old!r} (checkpoint) vs {new!r} (this run)")
    return out


class Campaign:
    """Run ``trial_fn(i)`` for ``i in range(n_trials)``, checkpointing each outcome to ``path``.

    ``config`` must hold everything that changes an outcome; the torch and mystique versions are
    added here. A checkpoint written with another config raises :class:`UsageError` naming the
    differences (on :meth:`run` or :meth:`load`).
    """

    def __init__(self, name: str, config: dict[str, Any], n_trials: int, trial_fn: TrialFn,
                 checkpoint_dir: str | os.PathLike | None = None, *, checkpoint: str | os.PathLike | None = None,
                 fsync_every: int = 500, progress_every: int = 0) -> None:
        self.name = name
        self.n_trials = int(n_trials)
        self.config = _canonical({"torch": torch.__version__, "mystique": mystique.__version__, **config,
                                  "campaign": name, "n_trials": self.n_trials})
        self.hash = config_hash(self.config)
        self.trial_fn = trial_fn
        if checkpoint is not None:
            self.path: Path | None = Path(checkpoint)
        elif checkpoint_dir is not None:
            self.path = Path(checkpoint_dir) / f"campaign_{name}.jsonl"
        else:
            self.path = None
        self.fsync_every = fsync_every
        self.progress_every = progress_every
        self.resumed = 0

    def _refuse(self, differences: list[str]) -> UsageError:
        return UsageError(f"checkpoint {self.path} was written by a campaign {self.name!r} with other settings ("
                          + "; ".join(differences) + "): its outcomes do not apply to this run; use another "
                          "--checkpoint folder or remove the file")

    def load(self) -> dict[int, dict[str, Any]]:
        """Outcomes already in the checkpoint (first record of each trial), repairing a torn tail.

        Raises :class:`UsageError` if the checkpoint was written with another config."""
        done: dict[int, dict[str, Any]] = {}
        if self.path is None or not self.path.exists():
            return done
        data = self.path.read_bytes()
        lines = data.split(b"\n")
        torn = not data.endswith(b"\n") and data != b""
        complete = lines[:-1]  # the piece after the last newline is empty or torn
        for raw in complete:
            try:
                rec = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError):
                continue
            if not isinstance(rec, dict):
                continue
            if isinstance(rec.get("header"), dict):  # the config the file was written with
                if rec["header"] != self.config:
                    raise self._refuse(config_differences(rec["header"], self.config))
                continue
            if rec.get("config") != self.hash:
                raise self._refuse([f"config hash: {rec.get('config')!r} (checkpoint) vs {self.hash!r} (this run)"])
            i = rec.get("trial")
            if isinstance(i, int) and 0 <= i < self.n_trials and i not in done:
                done[i] = rec
        if torn:
            atomic_write_bytes(self.path, b"".join(line + b"\n" for line in complete))
        return done

    def run(self) -> list[dict[str, Any]]:
        """All outcomes, ordered by trial index (resuming from the checkpoint)."""
        done = self.load()
        self.resumed = len(done)
        todo = [i for i in range(self.n_trials) if i not in done]
        fh: AbstractContextManager[Any]
        if self.path is not None and todo:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fresh = not self.path.exists() or self.path.stat().st_size == 0
            fh = open(self.path, "ab")  # noqa: SIM115
            if fresh:  # the config first: a later run with other settings is refused, not mixed in
                fh.write((json.dumps({"config": self.hash, "header": self.config}, sort_keys=True) + "\n").encode())
                fh.flush()
        else:
            fh = nullcontext(None)
        prog = Progress(f"campaign {self.name}", total=self.n_trials)
        prog.count = len(done)
        with fh as out:
            for n, i in enumerate(todo, 1):
                rec = {"config": self.hash, "trial": i, **self.trial_fn(i)}
                done[i] = json.loads(json.dumps(rec, default=float))
                if out is not None:
                    out.write((json.dumps(rec, default=float) + "\n").encode())
                    out.flush()
                    if n % self.fsync_every == 0:
                        os.fsync(out.fileno())
                if self.progress_every and n % self.progress_every == 0:
                    prog.step(f"{len(done)} trials", advance=self.progress_every)
            if out is not None:
                os.fsync(out.fileno())
        return [done[i] for i in range(self.n_trials)]


# ----------------------------------------------------------------------------- inputs

DISTRIBUTIONS = ("normal", "positive", "heavy", "rowscale", "relu")


def random_matrix(shape: tuple[int, int], dist: str, g: torch.Generator) -> torch.Tensor:
    """A float32 matrix drawn from one of :data:`DISTRIBUTIONS` (CPU; move it to the device)."""
    if dist == "normal":
        return torch.randn(shape, generator=g)
    if dist == "positive":
        return torch.rand(shape, generator=g)
    if dist == "heavy":
        return torch.randn(shape, generator=g).mul(1.5).exp() * torch.randn(shape, generator=g).sign()
    if dist == "rowscale":
        return torch.randn(shape, generator=g) * 10 ** (torch.rand(shape[0], 1, generator=g) * 4 - 2)
    if dist == "relu":
        return torch.randn(shape, generator=g).relu()
    raise ValueError(dist)


def _int8(shape: tuple[int, int], g: torch.Generator) -> torch.Tensor:
    return torch.randint(-128, 128, shape, generator=g, dtype=torch.int8)


def _rms(t: torch.Tensor) -> float:
    t = t.double()
    return float(t.square().mean().sqrt()) if t.numel() else 0.0


def _delta(clean: torch.Tensor, faulty: torch.Tensor) -> float:
    d = (faulty.double() - clean.double()).abs()
    if not bool(torch.isfinite(faulty.double()).all()):
        return math.inf
    return float(d.max()) if d.numel() else 0.0


# ----------------------------------------------------------------------------- detection trials

GEMM_OPS = ("gemm_float32", "gemm_bfloat16", "gemm_float16", "gemm_int8")
EMB_OPS = ("embedding_bag_sum", "embedding_bag_mean", "embedding_bag_8bit_sum", "embedding_bag_8bit_mean")
CONTRAST_OPS = ("gemm_bfloat16_rounded_check",)


def detection_combos(ops: Iterable[str], patterns: Iterable[str] = ("single", "burst", "multiple")
                     ) -> list[tuple[str, str, str, str]]:
    """Every (op, site, bit_class, pattern) a detection campaign cycles through."""
    combos = []
    for op in ops:
        if op.startswith("gemm"):
            if op == "gemm_int8":
                site_classes = {"gemm_output": ("sign", "high", "low"), "gemm_operand": ("sign", "high", "low")}
            else:
                site_classes = {"gemm_output": ("sign", "exponent", "mantissa"),
                                "gemm_operand": ("sign", "exponent", "mantissa")}
            if op in CONTRAST_OPS:
                site_classes = {"gemm_output": ("sign", "exponent", "mantissa")}
        elif "8bit" in op:
            site_classes = {"embedding_row": ("high", "low", "scale_bias"), "bag_output": ("sign", "exponent", "mantissa")}
        else:
            site_classes = {"embedding_row": ("sign", "exponent", "mantissa"),
                            "bag_output": ("sign", "exponent", "mantissa")}
        for site, classes in site_classes.items():
            for cls in classes:
                for pat in patterns:
                    combos.append((op, site, cls, pat))
    return combos


def gemm_trial(op: str, site: str, bit_class: str, pattern: str, seed: int, device: str,
               active: Callable[[], AbstractContextManager[Any]], max_dim: int = 96) -> dict[str, Any]:
    """One injected flip into a checked GEMM; returns the outcome (significant, detected, ...)."""
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    m, k, n = (rng.randint(4, max_dim) for _ in range(3))
    dist = rng.choice(DISTRIBUTIONS)
    kind = op.removeprefix("gemm_").removesuffix("_rounded_check")
    if kind == "int8":
        a, b = _int8((m, k), g).to(device), _int8((k, n), g).to(device)
    else:
        dt = getattr(torch, kind)
        a = random_matrix((m, k), dist, g).to(dt).to(device)
        b = random_matrix((k, n), dist, g).to(dt).to(device)
    clean = accumulate(a, b)  # golden: outside the device-under-test mode
    clean_out = clean if kind in ("int8", "float32") else clean.to(a.dtype)
    k_bits = rng.choice((2, 3, 4)) if pattern != "single" else 1
    with active():
        if kind == "int8":
            enc = encode_gemm(a, b)
        else:
            enc = encode_gemm(a.float(), b.float())
            if op not in CONTRAST_OPS:  # checked_mm's path: the verdict prepared before the product
                prime(enc, None)
        a_used = a
        if site == "gemm_operand":
            a_used = a.clone()
            rec = flip_tensor(a_used, seed=seed, site=site, name=op, bit_class=bit_class, pattern=pattern, k=k_bits)
        acc = accumulate(a_used, b)
        if site == "gemm_output":
            rec = flip_tensor(acc, seed=seed, site=site, name=op, bit_class=bit_class, pattern=pattern, k=k_bits)
        if kind == "int8":
            out = acc
            rep = verify_gemm(enc, acc, dtype=torch.int8)
        elif kind == "float32":
            out = acc
            rep = verify_gemm(enc, acc, dtype=a.dtype)
        elif op in CONTRAST_OPS:
            out = acc.to(a.dtype)
            rep = verify_gemm(enc, out.float(), dtype=a.dtype, u=UNIT_ROUNDOFF[torch.float32],
                              u_out=UNIT_ROUNDOFF[a.dtype])
        else:
            out = acc.to(a.dtype)
            rep = verify_gemm(enc, acc, dtype=a.dtype)
    delta = _delta(clean_out, out)
    tol = 0.0 if kind == "int8" else SIGNIFICANCE * _rms(clean_out)
    sure = None if kind == "int8" or op in CONTRAST_OPS else _gemm_sure(a, b, site, a_used, acc.shape, rec)
    return {"op": op, "site": site, "bit_class": bit_class, "pattern": pattern, "seed": seed,
            "shape": [m, k, n], "dist": dist if kind != "int8" else "int8", "bits": rec.bits, "index": rec.index,
            "original": rec.original, "corrupted": rec.corrupted, "delta": delta, "tol": tol,
            "significant": bool(delta > tol), "detected": bool(rep.alarm), "ratio": rep.max_ratio, "sure": sure}


def _gemm_sure(a: torch.Tensor, b: torch.Tensor, site: str, a_used: torch.Tensor, shape: torch.Size,
               rec: Any) -> bool:
    """Whether a float GEMM trial's flip is sure to raise the alarm by the check's own bound
    (:func:`.abft.gemm.sure_row_alarms`, with the unit roundoff and lambda :func:`verify_gemm` used: fp32's,
    the default): its exact change of some row's checksum exceeds ``thr(a) + thr(a_after)``. The change is
    ``(a_after - a) @ b`` in fp64 for an operand flip, the flipped accumulator element's change for an
    output flip."""
    a32, b32 = a.float(), b.float()
    if site == "gemm_operand":
        change = (a_used.detach().cpu().double() - a.detach().cpu().double()) @ b.detach().cpu().double()
        return bool(sure_row_alarms(a32, b32, change, a_used.float()).any())
    change = torch.zeros(tuple(shape), dtype=torch.float64)
    change.view(-1)[rec.index] = rec.corrupted - rec.original  # (inf or NaN where the flip made one)
    return bool(sure_row_alarms(a32, b32, change).any())


def embedding_trial(op: str, site: str, bit_class: str, pattern: str, seed: int, device: str,
                    active: Callable[[], AbstractContextManager[Any]]) -> dict[str, Any]:
    """One injected flip into a checked EmbeddingBag (fp32 or 8-bit row-wise table) or its output."""
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    rows, d = rng.randint(16, 256), rng.choice((4, 8, 16, 32, 64))
    bags, max_len = rng.randint(1, 16), rng.randint(1, 24)
    dist = rng.choice(DISTRIBUTIONS)
    weight = random_matrix((rows, d), dist, g)
    lengths = [rng.randint(1, max_len) for _ in range(bags)]
    idx = torch.randint(0, rows, (sum(lengths),), generator=g)
    offsets = torch.tensor([0, *torch.tensor(lengths).cumsum(0)[:-1].tolist()], dtype=torch.int64)
    mode = "mean" if op.endswith("mean") else "sum"
    k_bits = rng.choice((2, 3, 4)) if pattern != "single" else 1
    quant = "8bit" in op
    idx, offsets = idx.to(device), offsets.to(device)
    if quant:
        table = QuantizedTable.from_float(weight.to(device))
        clean = quantized_embedding_bag(table, idx, offsets, mode)
    else:
        table = checked_table(weight.to(device))
        clean = F.embedding_bag(idx, table.weight, offsets, mode=mode)
    pos = rng.randrange(idx.numel())
    row = int(idx[pos])
    with active():
        if quant:
            packed = table.packed.clone()
            if site == "embedding_row":
                if bit_class == "scale_bias":
                    col = d + rng.randrange(8)
                    bits = choose_bits(torch.uint8, "any", pattern, k_bits, rng)
                else:
                    col = rng.randrange(d)
                    bits = choose_bits(torch.uint8, bit_class, pattern, k_bits, rng)
                orig, new = flip_bits_(packed, row * packed.shape[1] + col, bits)
                index = row * packed.shape[1] + col
            faulty = QuantizedTable(packed, table.checks, d)
            call = FusedCall.of(faulty.fused(), Bags(table.checks, idx, offsets, mode, None, bags, d, BYTE_BAG_EXTRA,
                                                       0.0, None, op, "uint8", (rows, d, bags)))
            out, rep = _checked_bag(call, site, lambda: quantized_embedding_bag(faulty, idx, offsets, mode))
            if site == "bag_output":
                rec = flip_tensor(out, seed=seed, site=site, name=op, bit_class=bit_class, pattern=pattern, k=k_bits)
                bits, index, orig, new = rec.bits, rec.index, rec.original, rec.corrupted
            if rep is None:
                rep = call.verdict(out) if call is not None else \
                    verify_bag_output(out, table.checks, idx, offsets, mode, extra=BYTE_BAG_EXTRA, op=op, dtype="uint8")
        else:
            faulty = table.weight.clone()
            if site == "embedding_row":
                col = rng.randrange(d)
                bits = choose_bits(torch.float32, bit_class, pattern, k_bits, rng)
                index = row * faulty.shape[1] + col
                orig, new = flip_bits_(faulty, index, bits)
            call = FusedCall.of(fused_table(faulty, table.checks, d), Bags(
                table.checks, idx, offsets, mode, None, bags, d, FP32_BAG_EXTRA, 0.0, None, op, "float32", (rows, d, bags)))
            out, rep = _checked_bag(call, site, lambda: F.embedding_bag(idx, faulty, offsets, mode=mode))
            if site == "bag_output":
                rec = flip_tensor(out, seed=seed, site=site, name=op, bit_class=bit_class, pattern=pattern, k=k_bits)
                bits, index, orig, new = rec.bits, rec.index, rec.original, rec.corrupted
            if rep is None:
                rep = call.verdict(out) if call is not None else \
                    verify_bag_output(out, table.checks, idx, offsets, mode, extra=FP32_BAG_EXTRA, op=op)
    delta = _delta(clean, out)
    tol = SIGNIFICANCE * _rms(clean)
    sure: bool | None = None  # an output flip: no bound of the table's checksums applies (the old rule)
    if site == "embedding_row":  # by the check's own bound (sure_alarms), for the extra its lookup used
        sums = QuantizedTable.row_sums64 if quant else row_sums64
        before, after = (table.packed, packed) if quant else (table.weight, faulty)
        sure = bool(sure_alarms(sums(before.cpu()), sums(after.cpu()), idx.cpu(), offsets.cpu(), mode, d,
                                BYTE_BAG_EXTRA if quant else FP32_BAG_EXTRA).any())
    return {"op": op, "site": site, "bit_class": bit_class, "pattern": pattern, "seed": seed,
            "shape": [rows, d, bags], "dist": dist, "bits": bits, "index": index, "original": float(orig),
            "corrupted": float(new), "delta": delta, "tol": tol, "significant": bool(delta > tol),
            "detected": bool(rep.alarm), "ratio": rep.max_ratio, "sure": sure}


def _checked_bag(call: Any, site: str, lookup: Callable[[], torch.Tensor]
                 ) -> tuple[torch.Tensor, CheckReport | None]:
    """The lookup of a detection trial as the product checks it: on the CPU the fused compiled lookup
    (``call``), with its own verdict for a table flip (as ``checked_embedding_bag``) and, for an output
    flip (injected after it), without, the output being checked after the flip (as ``protect``'s hook);
    elsewhere torch's lookup. Returns ``(out, report or None: check the output later)``."""
    if call is None:
        return lookup(), None
    return call.run(lookup, check=site != "bag_output")


def detection_trial_fn(combos: list[tuple[str, str, str, str]], seed: int, device: str,
                       active: Callable[[], AbstractContextManager[Any]], schedule: list[int] | None = None,
                       salt: tuple[Any, ...] = ("detection",)) -> TrialFn:
    """Trial ``i`` runs combo ``i % len(combos)`` (or ``combos[schedule[i]]``) with its own seed, derived
    from ``seed``, ``salt`` and ``i``."""

    def fn(i: int) -> dict[str, Any]:
        op, site, cls, pat = combos[i % len(combos) if schedule is None else schedule[i]]
        s = hash_seed(seed, *salt, i)
        if op.startswith("gemm"):
            return gemm_trial(op, site, cls, pat, s, device, active)
        return embedding_trial(op, site, cls, pat, s, device, active)

    return fn


# ----------------------------------------------------------------------------- clean trials

CLEAN_OPS = ("gemm_float32", "gemm_bfloat16", "gemm_float16", "gemm_int8", "linear_float32",
             "embedding_bag_sum", "embedding_bag_mean", "embedding_bag_8bit_sum", "embedding_bag_8bit_mean")


def clean_trial_fn(seed: int, device: str, active: Callable[[], AbstractContextManager[Any]],
                   max_dim: int = 48) -> TrialFn:
    """Trial ``i``: one checked operation on clean random data; the outcome records any alarm.

    Each operation is checked twice, by the product's path (lower-bound thresholds first) and with
    ``exact_ratio`` (every exact threshold): ``alarm`` is either's alarm, ``ratio`` the exact
    largest ``|diff| / threshold`` and ``paths_agree`` whether both reached the same verdict.
    """

    def fn(i: int) -> dict[str, Any]:
        s = hash_seed(seed, "clean", i)
        rng = random.Random(s)
        g = torch.Generator().manual_seed(s)
        op = CLEAN_OPS[i % len(CLEAN_OPS)]
        dist = rng.choice(DISTRIBUTIONS)
        reps: list[CheckReport] = []
        scale = 10.0 ** rng.uniform(-6, 6)
        if op.startswith(("gemm", "linear")):
            m, k, n = (rng.randint(1, max_dim) for _ in range(3))
            if op == "gemm_int8":
                a, b = _int8((m, k), g).to(device), _int8((k, n), g).to(device)
            else:
                dt = getattr(torch, op.split("_", 1)[1])
                sc = min(scale, 1e3) if dt == torch.float16 else scale
                a = (random_matrix((m, k), dist, g) * sc).to(dt).to(device)
                b = random_matrix((k, n), dist, g).to(dt).to(device)
            bias = random_matrix((1, n), dist, g)[0].to(device) * scale if op.startswith("linear") else None
            with active():
                for exact in (False, True):  # the product's path (verdict), then the exact ratio
                    if bias is not None:
                        _, rep = checked_linear(a, b.t().contiguous(), bias, exact_ratio=exact)
                    else:
                        _, rep = checked_mm(a, b, exact_ratio=exact)
                    reps.append(rep)
            shape = [m, k, n]
        else:
            rows, d = rng.randint(1, 128), rng.choice((1, 3, 8, 16, 64))
            bags, max_len = rng.randint(1, 12), rng.randint(1, 30)
            weight = (random_matrix((rows, d), dist, g) * scale).to(device)
            lengths = [rng.randint(0, max_len) for _ in range(bags)]
            idx = torch.randint(0, rows, (sum(lengths),), generator=g).to(device)
            offsets = torch.tensor([0, *torch.tensor(lengths).cumsum(0)[:-1].tolist()], dtype=torch.int64).to(device)
            mode = "mean" if op.endswith("mean") else "sum"
            if "8bit" in op:
                table = QuantizedTable.from_float(weight)
                with active():
                    reps.extend(checked_quantized_embedding_bag(table, idx, offsets, mode, exact_ratio=x)[1]
                                for x in (False, True))
            else:
                table = checked_table(weight)
                with active():
                    reps.extend(checked_embedding_bag(table, idx, offsets, mode, exact_ratio=x)[1]
                                for x in (False, True))
            shape = [rows, d, bags]
        return {"op": op, "seed": s, "dist": dist, "scale": scale, "shape": shape,
                "alarm": bool(reps[0].alarm or reps[1].alarm), "ratio": reps[1].max_ratio,
                "paths_agree": reps[0].alarm == reps[1].alarm}

    return fn
