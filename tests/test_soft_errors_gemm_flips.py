"""Which bf16 GEMM flips the check must see, and why the detection campaign's rule misses some "significant" ones.

:func:`sure_row_alarms` is the check's own resolution (a change of a row's checksum beyond the rounding a
clean product and its reference may make): every such flip alarms. The campaign calls a flip significant
when the bf16 *output* moves by more than 2^-7 rms(output); one bf16 ulp of an element above the rms is
already that much, so a flip whose effect on the fp32 accumulator is far below both the check's bound and
2^-7 rms can tip one rounding and count as a significant miss (the full campaign's 0.9983 rate).
"""

from __future__ import annotations

import contextlib
import random

import torch
from mystique.validators.soft_errors.abft.gemm import sure_row_alarms
from mystique.validators.soft_errors.campaign import (
    DISTRIBUTIONS,
    SIGNIFICANCE,
    _rms,
    gemm_trial,
    random_matrix,
)
from mystique.validators.soft_errors.inject import flip_tensor

from mystique.faults.bits import hash_seed

#: a miss of the recorded campaign's kind (found by a seeded run of gemm_trial): rowscale data, one flip
#: of mantissa bit 3 of an operand element (-2.90625 -> -2.78125)
MISSED_SEED = 1252937709101337556


def _operands(seed: int, kind: torch.dtype = torch.bfloat16) -> tuple[torch.Tensor, torch.Tensor]:
    """The operands gemm_trial draws for ``seed``."""
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    m, k, n = (rng.randint(4, 96) for _ in range(3))
    dist = rng.choice(DISTRIBUTIONS)
    return random_matrix((m, k), dist, g).to(kind), random_matrix((k, n), dist, g).to(kind)


def test_missed_bf16_operand_flip_is_below_the_checks_resolution_and_the_significance_rule() -> None:
    o = gemm_trial("gemm_bfloat16", "gemm_operand", "mantissa", "single", MISSED_SEED, "cpu", contextlib.nullcontext)
    assert o["significant"] and not o["detected"], o
    assert o["bits"] == [3] and (o["original"], o["corrupted"]) == (-2.90625, -2.78125)
    a, b = _operands(MISSED_SEED)
    bad = a.clone()
    bad.view(-1)[o["index"]] = o["corrupted"]
    change = (bad.double() - a.double()) @ b.double()
    i = o["index"] // a.shape[1]
    # below the check's resolution: the row's checksum moved by about half its bound (report ratio 0.54)
    assert 0.4 < o["ratio"] < 1.0
    assert not sure_row_alarms(a.float(), b.float(), change, bad.float())[i]
    # the flip moved the fp32 product by under a tenth of the significance threshold ...
    clean = a.float() @ b.float()
    tol = SIGNIFICANCE * _rms(clean.to(torch.bfloat16))
    assert float(change.abs().max()) < 0.1 * tol
    # ... and is "significant" only because it tipped one bf16 rounding: the output moved by one ulp
    out, out_bad = clean.to(torch.bfloat16), (bad.float() @ b.float()).to(torch.bfloat16)
    j = int((out_bad.double() - out.double()).abs().argmax())
    moved = float((out_bad.double() - out.double()).view(-1)[j])
    ulp = 2.0 ** (torch.frexp(out.view(-1)[j].float()).exponent.item() - 8)
    assert abs(moved) == ulp == o["delta"] > tol


def test_every_bf16_gemm_flip_beyond_the_checks_resolution_alarms() -> None:
    sure = 0
    for t in range(450):
        site = ("gemm_operand", "gemm_output")[t % 2]
        cls = ("sign", "exponent", "mantissa")[t // 2 % 3]
        pat = ("single", "burst", "multiple")[t // 6 % 3]
        seed = hash_seed(7, "sure", t)
        o = gemm_trial("gemm_bfloat16", site, cls, pat, seed, "cpu", contextlib.nullcontext)
        a, b = _operands(seed)
        if site == "gemm_operand":
            bad = a.clone()  # the flip gemm_trial made: its rng draws the shape, distribution and bit count
            rng = random.Random(seed)
            for _ in range(3):
                rng.randint(4, 96)
            rng.choice(DISTRIBUTIONS)
            flip_tensor(bad, seed=seed, site=site, name="gemm_bfloat16", bit_class=cls, pattern=pat,
                        k=rng.choice((2, 3, 4)) if pat != "single" else 1)
            change, after = (bad.double() - a.double()) @ b.double(), bad.float()
        else:
            acc = a.float() @ b.float()
            change = torch.zeros(acc.shape, dtype=torch.float64)
            change.view(-1)[o["index"]] = o["corrupted"] - o["original"]
            after = a.float()
        if sure_row_alarms(a.float(), b.float(), change, after).any():
            sure += 1
            assert o["detected"], (o, o["index"], o["bits"], o["ratio"])
    assert sure > 150  # the sweep reaches flips beyond the resolution on every site and bit class
