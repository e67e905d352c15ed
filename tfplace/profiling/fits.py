"""Fits of op time over the per-device batch size, as options next to the default
`tfplace.formats.profile.interpolate_seconds` (piecewise linear, exact at measured points, extrapolated
from the two nearest points).

    robust_seconds(batches, secs, b)   exact at measured points, robust extrapolation
    affine_fit(batches, secs)          seconds = a + slope * batch, least squares, a, slope >= 0
    smoothed(profile, kinds)           every op's points replaced by its affine fit

Why: an op's time is close to affine in the batch (a fixed launch/setup part plus work that
grows with the samples), and points measured on a shared machine are noisy. Between measured
points the piecewise-linear line is fine and exact; beyond them, the slope between the last two
points alone can be far off (even negative, which the default clips to a flat or zero time). The
slope of the least-squares line through all points is steadier, so `robust_seconds` extends the
nearest measured point with it (never below zero, never decreasing with the batch).
`smoothed` goes further and is not exact at measured points: use it only for noisy data.
Pure numpy.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence, Tuple

import numpy as np

from tfplace.formats.profile import Profile


def affine_fit(batches: Sequence[float], secs: Sequence[float]) -> Tuple[float, float]:
    """(intercept_s, slope_s_per_sample) of the least-squares line, both clamped to >= 0.

    One point: the line through the origin (time proportional to the batch).
    """
    b = np.asarray(batches, dtype=float)
    s = np.asarray(secs, dtype=float)
    if len(b) == 1:
        return 0.0, float(s[0] / b[0])
    slope, intercept = np.polyfit(b, s, 1)
    if slope < 0:  # work does not shrink with the batch: flat at the mean
        return float(max(s.mean(), 0.0)), 0.0
    if intercept < 0:  # through the origin instead (least squares with a = 0)
        return 0.0, float(max((b @ s) / (b @ b), 0.0))
    return float(intercept), float(slope)


def robust_seconds(batches: Sequence[float], secs: Sequence[float], batch_size: float) -> float:
    """Piecewise linear inside the measured range (exact at measured points); outside, the
    nearest measured point extended with the least-squares slope (>= 0), clipped at zero."""
    b = np.asarray(batches, dtype=float)
    s = np.asarray(secs, dtype=float)
    if b[0] <= batch_size <= b[-1]:
        return float(np.interp(batch_size, b, s))
    _, slope = affine_fit(b, s)
    end = 0 if batch_size < b[0] else -1
    return float(max(0.0, s[end] + slope * (batch_size - b[end])))


def smoothed(profile: Profile, kinds: Optional[Sequence[str]] = None) -> Profile:
    """A copy where each op's points (of `kinds`, default all) lie on their affine fit."""
    ops = {}
    for op, per in profile.ops.items():
        ops[op] = dict(per)
        for kind, (batches, secs) in per.items():
            if kinds is not None and kind not in kinds:
                continue
            a, slope = affine_fit(batches, secs)
            ops[op][kind] = (batches, tuple(float(a + slope * x) for x in batches))
    conditions = dict(profile.conditions)
    conditions["smoothed"] = "affine least squares per op (tfplace.profiling.fits.smoothed)"
    return dataclasses.replace(profile, ops=ops, conditions=conditions)
