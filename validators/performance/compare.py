"""Group ``fleet``: every figure this run measured against the same figure of its peers
(``baseline``: results.csv files of other devices of the same model), judged by :func:`.fleet.judge`.

Rows ``fleet_<check>`` (``fleet_gemm_throughput``, ``fleet_step_time``, ...) with metric
``<metric>_slowdown``: the slowdown vs the fleet median, its 95% interval in ``low`` and ``high``,
the limit as threshold; the fleet's median and spread in the detail. Peers of another device model are
left out (named in a ``fleet_peers`` row); without a baseline the group records one skip.
"""

from __future__ import annotations

from ._ctx import PerformanceContext
from .fleet import COMPARED, DEFAULT_MARGIN, judgement, measured_rows


def _model(name: str) -> str:
    """The device model of a ``device_name`` (an emulation suffix removed)."""
    return name.split(" (emulating", 1)[0].strip()


def run_fleet(ctx: PerformanceContext) -> None:
    """Compare with ``baseline`` peers (skip without one)."""
    baseline = ctx.options.get("baseline") or ()
    if isinstance(baseline, str):
        baseline = [baseline]
    if not baseline:
        ctx.res.add("fleet_comparison", ctx.target.label, "peers", 0, status="skip",
                    detail="no --baseline given: nothing to compare this device with")
        return
    margin = float(ctx.options.get("margin") or DEFAULT_MARGIN)
    rows = measured_rows(list(baseline))
    model = _model(ctx.device_name)
    same = rows[rows["device_name"].map(_model) == model]
    others = sorted(set(rows["device_name"]) - set(same["device_name"]))
    peers = sorted(set(same["peer"]))
    ctx.res.add("fleet_peers", model, "peers", len(peers), status="info",
                detail=f"{len(peers)} peer run(s) of {model} in {len(baseline)} baseline file(s)"
                       + (f"; left out (another model): {', '.join(others)}" if others else ""))
    if not peers:
        ctx.res.add("fleet_comparison", ctx.target.label, "peers", 0, status="skip",
                    detail=f"no baseline run of the same device model ({model})")
        return
    compared = 0
    for (check, subject, dtype, metric), m in ctx.measured.items():
        if (check, metric) not in COMPARED:
            continue
        sel = same[(same["check"] == check) & (same["subject"] == subject) & (same["dtype"] == dtype)
                   & (same["metric"] == metric)]
        values = [float(v) for v in sel.groupby("peer")["value"].median()]
        if not values:
            ctx.res.add(f"fleet_{check}", subject, f"{metric}_slowdown", None, status="skip", dtype=dtype,
                        detail="no peer measured this figure")
            continue
        j = judgement(m.value, m.lo, m.hi, values, m.higher_better, margin)
        ctx.res.add(f"fleet_{check}", subject, f"{metric}_slowdown", j.slowdown, threshold=j.limit, low=j.low,
                    high=j.high, status=j.status, dtype=dtype,
                    detail=f"{j.detail}; this device {m.value:.6g} {m.unit} [{m.lo:.6g}, {m.hi:.6g}]")
        compared += 1
    if not compared:
        ctx.res.add("fleet_comparison", ctx.target.label, "figures", 0, status="skip",
                    detail="nothing measured in this run to compare (run micro or sustained with fleet)")
