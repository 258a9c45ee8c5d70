"""Binomial statistics for campaigns: the one implementation is :mod:`mystique.binomial` (Wilson score
intervals, rate verdicts from them, the trials a verdict needs), shared with the reports."""

from __future__ import annotations

from mystique.binomial import Z95, rate_verdict, trials_to_pass, wilson

__all__ = ["Z95", "rate_verdict", "trials_to_pass", "wilson"]
