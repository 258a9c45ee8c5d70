"""State shared by the check groups of one numerics run (a :class:`GroupContext` with the dtypes
under test), and the row helpers."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from mystique.dtypes import name as dtype_name

from ..groups import GroupContext
from ..unsupported import unsupported
from ._fp import SWEEP_DTYPES


def _fmt(v: float) -> str:
    return "nan" if v != v else f"{v:.4g}"


@dataclass
class Ctx(GroupContext):
    """One numerics run: the :class:`GroupContext` fields plus the dtypes under test."""

    dtypes: tuple[torch.dtype, ...] = SWEEP_DTYPES

    @property
    def device(self) -> torch.device:
        return torch.device(self.target.device)

    def generator(self, salt: int = 0) -> torch.Generator:
        """A CPU generator seeded from the run seed and ``salt`` (inputs are made on the CPU)."""
        g = torch.Generator()
        g.manual_seed((self.seed * 1_000_003 + salt) % (2**63 - 1))
        return g

    def to_device(self, t: torch.Tensor) -> torch.Tensor:
        """Copy a reference-side tensor to the device under test (outside the injected mode)."""
        return t.to(self.device)

    def on_device(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` as the device under test (inside ``target.active()``) and synchronize."""
        with self.target.active():
            out = fn()
        self.target.synchronize()
        return out

    def attempt(self, check: str, subject: str, fn: Callable[[], Any], *, dtype: torch.dtype | None = None,
                repro: str = "") -> Any:
        """``fn()``; after a RuntimeError, a ``skip`` row where torch says the device has no kernel for
        the op or dtype (:func:`mystique.validators.unsupported.unsupported`), else an ``error`` row
        carrying ``repro``, and None."""
        try:
            return fn()
        except RuntimeError as exc:
            why = unsupported(exc)
            if why:
                self.skip(check, subject, why[:160], dtype=dtype)
            else:
                self.error(check, subject, exc, dtype=dtype, repro=repro)
            return None

    def repro(self, **facts: Any) -> str:
        """``seed=S level=L k=v ...``: what reproduces a row."""
        items = " ".join(f"{k}={v}" for k, v in facts.items())
        return f"seed={self.seed} level={self.level} {items}".strip()

    def bound(self, check: str, subject: str, metric: str, value: float, threshold: float, *,
              dtype: torch.dtype | None = None, unit: str = "", detail: str = "", repro: str = "") -> None:
        """A row that passes when ``value <= threshold`` (NaN and inf fail); failing rows carry ``repro``."""
        ok = math.isfinite(value) and value <= threshold
        why = "" if ok else f"{metric}={_fmt(value)} exceeds bound {_fmt(threshold)}; "
        self.res.add(check, subject, metric, value if not math.isinf(value) else math.inf, status="pass" if ok else "fail",
                     unit=unit, threshold=threshold, dtype=dtype_name(dtype) if dtype else "",
                     detail=(why + (detail + "; " if detail else "") + repro) if not ok else detail)

    def fact(self, check: str, subject: str, metric: str, value: float, *, ok: bool,
             dtype: torch.dtype | None = None, unit: str = "", threshold: float | None = None,
             detail: str = "", repro: str = "") -> None:
        """A row recording a measured property, judged by the caller: ``ok`` (no default: a fact that
        cannot fail is a measurement, not a check) passes it, ``ok=False`` makes it a failure
        carrying ``repro``."""
        self.res.add(check, subject, metric, value, status="pass" if ok else "fail", unit=unit,
                     threshold=threshold, dtype=dtype_name(dtype) if dtype else "",
                     detail=detail if ok else f"{detail}; {repro}" if detail else repro)

    def skip(self, check: str, subject: str, reason: str, *, dtype: torch.dtype | None = None,
             metric: str = "") -> None:
        self.res.add(check, subject, metric, None, status="skip", dtype=dtype_name(dtype) if dtype else "",
                     detail=reason)

    def error(self, check: str, subject: str, exc: BaseException, *, dtype: torch.dtype | None = None,
              repro: str = "") -> None:
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        self.res.add(check, subject, "", None, status="error", dtype=dtype_name(dtype) if dtype else "",
                     detail=f"{type(exc).__name__}: {msg[:300]}; {repro}")


def shapes_of(tensors: Iterable[torch.Tensor]) -> str:
    return ",".join("x".join(map(str, t.shape)) or "scalar" for t in tensors)
