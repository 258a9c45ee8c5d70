"""numerics ``moe_router_flips`` (issue 34): Llama 4's router under bf16/fp16 autocast against fp64 on
the same input; flips within the scores' rounding bound pass, a faulty GEMM lane fails."""

from __future__ import annotations

from mystique.validators import numerics

from mystique.targets import make_target


def _rows(df, check):
    return df[df.check == check].set_index("dtype")


def test_healthy_router_flips_only_at_near_ties():
    df = numerics.run(make_target("cpu"), groups=["moe_router_flips"])
    flips = _rows(df, "moe_router_flips")
    assert set(flips.index) == {"bfloat16", "float16"} and (flips.status == "pass").all()
    assert (flips.value == 0).all() and (_rows(df, "moe_router_flip_rate").status == "info").all()


def test_a_stuck_router_lane_flips_beyond_the_bound():
    # expert 3's score reads 1000 in every matmul result: tokens move to it whatever their scores
    df = numerics.run(make_target("cpu", inject="stuck_lane:lane=3,width=16,value=1000"), groups=["moe_router_flips"])
    flips = _rows(df, "moe_router_flips")
    assert (flips.status == "fail").all() and (flips.value > 0).all()
    assert "reproduce" in flips.detail.iloc[0] or "seed=0" in flips.detail.iloc[0]
