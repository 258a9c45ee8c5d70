"""The fused ABFT kernels (issue 32) compile for an H100 (sm_90) on this CPU host: Triton's front end, its
optimiser and ptxas, as a CUDA launch would run them, for the specialisations the CUDA paths launch (dtype,
bias, fault injection, the bf16 split reference; the EmbeddingBag's table dtypes, widths, pooling, weights and
last offset). The interpreter tests check what the kernels compute; this checks that the GPU compiler accepts
them (tile shapes, dot operand dtypes, masks), which the interpreter does not. Compile only: no GPU runs them
here. In a process of its own, Triton imported without ``TRITON_INTERPRET`` (the test session's Triton runs
the interpreter). Opt-in (``-m slow``, about 20 s); skipped, saying why, where Triton or its NVIDIA backend is
absent. ``python tests/test_soft_errors_triton_sm90.py`` prints one line per kernel."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

MM = dict(sm_ptr="*fp32", sn_ptr="*fp32", rpart_ptr="*fp32", cpart_ptr="*fp32", ref_ptr="*fp32", worst_ptr="*fp32",
          flip_ptr="*i32", M="i32", N="i32", K="i32", sam="i32", sak="i32", sbk="i32", sbn="i32", sym="i32", syn="i32",
          NT="i32", MT="i32")
#: (dtype, reference columns' dtype, their count R, tile (BM, BN, BK, warps, stages), dot precision): linear.tiles
GEMMS = [("bf16", "bf16", 6, (128, 128, 64, 8, 3), "ieee"),  # the reference split in three bf16 parts
         ("fp16", "fp16", 2, (128, 128, 64, 8, 3), "ieee"),
         ("fp32", "fp32", 2, (128, 128, 32, 8, 3), "tf32")]
BAGS = [(t, o, q, d, m, w, last) for t, o, q in (("fp32", "fp32", False), ("bf16", "bf16", False),
                                                 ("fp16", "fp16", False), ("u8", "fp32", True))
        for d, m, w, last in ((64, False, True, False), (128, True, False, True))]


def _compile(fn, sig: dict, consts: dict, **opts) -> int:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    full = {**sig, **{k: "constexpr" for k in consts}}
    src = ASTSource(fn, signature={k: full[k] for k in fn.arg_names}, constexprs=consts)
    return len(triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts).asm["cubin"])


def main() -> int:
    """Compile every specialisation; one line each (``ok`` or ``FAILED``); exit 1 if any failed."""
    from mystique.validators.soft_errors.triton_abft import _jit

    cases = []
    for dt, v, r, (bm, bn, bk, warps, stages), prec in GEMMS:
        for bias, fault in ((False, False), (True, True)):
            sig = {**MM, **{k: "*" + dt for k in ("a_ptr", "b_ptr", "y_ptr", "bias_ptr")}, "v_ptr": "*" + v}
            consts = dict(BM=bm, BN=bn, BK=bk, RP=16, R=r, HAS_BIAS=bias, PREC=prec, REF_PREC=prec, UPCAST=False,
                          REF_UPCAST=dt == "fp16", FAULT=fault, GROUP_M=8)
            cases.append((f"checked_mm_kernel {dt} bias={bias} fault={fault}", _jit.checked_mm_kernel, sig, consts,
                          dict(num_warps=warps, num_stages=stages)))
    vsig = dict(rpart_ptr="*fp32", ref_ptr="*fp32", vw_ptr="*fp32", cw_ptr="*fp32", got_ptr="*fp32", refo_ptr="*fp32",
                worst_ptr="*fp32", M="i32", NT="i32", factor="fp32", det="fp32", tiny="fp32")
    for split in (False, True):
        cases.append((f"verdict_kernel split={split}", _jit.verdict_kernel, vsig,
                      dict(NTP=64, BMV=128, SPLIT=split, HAS_VW=split), dict(num_warps=4)))
    for table, out, quant, d, mean, weighted, last in BAGS:
        sig = dict(w_ptr="*" + table, idx_ptr="*i64", off_ptr="*i64", rowsum_ptr="*fp32", absum_ptr="*fp32",
                   out_ptr="*" + out, worst_ptr="*fp32", ratio_ptr="*fp32", n_idx="i32", n_bags="i32", n_rows="i32",
                   D="i32", stride_w="i32", k_lam="fp32", d_extra="fp32", tiny="fp32", psw_ptr="*fp32", pad="i32")
        consts = dict(BD=d, BL=16, QUANT=quant, MEAN=mean, WEIGHTED=weighted, LAST=last, MARGIN=1.0 + 2.0**-10)
        cases.append((f"checked_bag_kernel {table} D={d} mean={mean} weighted={weighted} last={last}",
                      _jit.checked_bag_kernel, sig, consts, dict(num_warps=1)))
    failed = 0
    for name, fn, sig, consts, opts in cases:
        try:
            print(f"ok {name}: cubin {_compile(fn, sig, consts, **opts)} bytes", flush=True)
        except Exception as e:  # (reported, one line each)
            failed += 1
            print(f"FAILED {name}: {type(e).__name__}: {' '.join(str(e).split())[:300]}", flush=True)
    return 1 if failed else 0


@pytest.mark.slow
def test_every_fused_kernel_compiles_for_sm90():
    pytest.importorskip("triton", reason="Triton is not installed (pip install -e '.[triton]')")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True, timeout=600)
    lines = [ln for ln in run.stdout.splitlines() if ln.startswith(("ok ", "FAILED "))]
    if not lines and ("ptxas" in run.stderr or "backend" in run.stderr.lower()):
        pytest.skip(f"Triton cannot compile for CUDA here: {run.stderr.strip().splitlines()[-1]}")
    assert run.returncode == 0 and len(lines) == 6 + 2 + len(BAGS), run.stdout + run.stderr[-2000:]


if __name__ == "__main__":
    sys.exit(main())
