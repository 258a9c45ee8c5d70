"""soft_errors ``abft_grouped_gemm`` (issue 34): the checked GEMM's encoding per expert group of a
grouped GEMM; clean products raise no alarm, a flip is found in its group, a faulty grouped kernel fails."""

from __future__ import annotations

from mystique.validators import soft_errors

from mystique.targets import make_target


def test_clean_groups_pass_and_a_faulty_grouped_kernel_fails():
    ok = soft_errors.run(make_target("cpu"), groups=["abft_grouped_gemm"])
    assert set(ok.status) == {"pass"} and len(ok) == 4
    bad = soft_errors.run(make_target("cpu", inject="bitflip:rate=0.05,bits=exponent,ops=_grouped_mm"),
                          groups=["abft_grouped_gemm"])
    clean = bad[bad.metric == "clean_alarm"]
    assert (clean.status == "fail").any(), bad[["dtype", "metric", "status", "detail"]]
