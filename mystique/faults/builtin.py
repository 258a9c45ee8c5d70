"""The built-in fault simulations, as ``mystique faults`` lists them: what each changes and which
real failure it imitates. A new simulation is a mode class (or builder) in this package plus one
entry here.
"""

from __future__ import annotations

from .bitflip import DEFAULT_BITFLIP_OPS, bitflip
from .kernels import NondeterministicReductionMode, StuckLaneMode, WrongGeluMode
from .numeric import LowPrecisionAccumMode, SubnormalFlushMode, TruncatingCastMode
from .slowness import StragglerMode, ThrottleMode
from .spec import FaultSpec

BUILTIN: tuple[FaultSpec, ...] = (
    FaultSpec(
        name="bitflip",
        summary="random bit flips (rate per element; bits sign|exponent|mantissa|any) in floating results "
                "of the ops matching the regex ops (default: matmul family and convolution)",
        imitates="mercurial cores: silent data corruption at scale (Meta, Dixit et al. 2021; Google, Hochschild "
                 "et al. 2021 'Cores that don't count'), defective execution units that flip result bits without "
                 "any error being raised; also particle-strike soft errors in unprotected datapath latches",
        build=bitflip,
        params={"rate": 1e-4, "bits": "any", "seed": 0, "ops": DEFAULT_BITFLIP_OPS},
    ),
    FaultSpec(
        name="stuck_lane",
        summary="matmul-family results (grouped expert GEMMs per group; ops: a regex narrowing the family) at "
                "last-dim index = lane mod width read value (or have the hex bit masks stuck1/stuck0 forced to 1/0)",
        imitates="a stuck-at fault in one SIMD lane or one matrix-unit output column (a manufacturing defect or "
                 "wear-out that escaped test): every result that lane produces is fixed or has a bit stuck, "
                 "the other lanes are right",
        build=StuckLaneMode,
        params={"lane": 3, "width": 16, "value": 0.0, "stuck1": "", "stuck0": "", "ops": ""},
    ),
    FaultSpec(
        name="truncating_casts",
        summary="float conversions to bfloat16/float16 (_to_copy, to, copy_) round toward zero instead of to "
                "nearest even (dtypes: bfloat16+float16)",
        imitates="a broken conversion unit (F2F/cvt) or a wrong rounding-mode default in firmware or a "
                 "conversion kernel: every low-precision value is biased toward zero by half an ulp on average",
        build=TruncatingCastMode,
        params={"dtypes": "bfloat16+float16"},
    ),
    FaultSpec(
        name="low_precision_accum",
        summary="bf16/fp16 mm, bmm, addmm, baddbmm, addbmm, mv, addmv, dot (and so linear/matmul) and _grouped_mm "
                "(per group; ops: a regex narrowing them) accumulate in the low dtype: partial sums of chunk products "
                "rounded to it after each",
        imitates="reduced-precision accumulators: early tensor cores and matrix units with fp16 accumulation, "
                 "FP8 tensor cores keeping about 14 accumulator bits, or a library picking a reduced-precision "
                 "reduction kernel; the error grows with K instead of staying one output rounding",
        build=LowPrecisionAccumMode,
        params={"chunk": 16, "ops": ""},
    ),
    FaultSpec(
        name="subnormal_flush",
        summary="FTZ/DAZ: subnormal results (outputs) and operands (inputs) of floating arithmetic read as zero",
        imitates="flush-to-zero / denormals-are-zero mode left on (MXCSR FTZ/DAZ set by code built with "
                 "-ffast-math, GPU kernels built with -ftz=true): tiny gradients, variances and softmax tails "
                 "vanish",
        build=SubnormalFlushMode,
        params={"inputs": True, "outputs": True},
    ),
    FaultSpec(
        name="wrong_gelu",
        summary="exact erf GELU (aten.gelu approximate='none', and its backward) computed with the tanh "
                "approximation",
        imitates="a wrong library kernel variant: a fused or vendor kernel that implements only tanh-GELU "
                 "dispatched for erf-GELU, a silent error of up to about 5e-4 per activation",
        build=WrongGeluMode,
        params={"backward": True},
    ),
    FaultSpec(
        name="nondeterministic_reduction",
        summary="sum, mean, nansum and matmul-family K reductions add their terms in a random order drawn per "
                "call (seed=-1: from OS entropy), so results vary in the last bits",
        imitates="non-deterministic reductions: atomicAdd-based or split-K kernels whose summation order depends "
                 "on thread scheduling, so repeated runs disagree bitwise (what torch.use_deterministic_algorithms "
                 "guards against)",
        build=NondeterministicReductionMode,
        params={"seed": -1},
    ),
    FaultSpec(
        name="throttle",
        summary="a fraction of operator calls (seeded draw per call) take factor x their own measured time: "
                "the mode busy-waits (factor - 1) x the call's time after it returns; results unchanged",
        imitates="a device held at reduced clocks (thermal or power capping, a degraded memory channel or "
                 "PCIe link): every affected kernel proportionally slower, silently, results right",
        build=ThrottleMode,
        params={"factor": 1.1, "fraction": 1.0, "seed": 0},
    ),
    FaultSpec(
        name="straggler",
        summary="occasional long stalls: after every every_s seconds of operator time on average "
                "(exponential gaps, seeded) the device stalls stall_ms; results unchanged",
        imitates="a straggler: ECC page retirement, driver or firmware hiccups, host interrupts or a noisy "
                 "neighbour stalling one device of a synchronous job now and then",
        build=StragglerMode,
        params={"every_s": 0.1, "stall_ms": 150.0, "seed": 0},
    ),
)
