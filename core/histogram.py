"""Cumulative histograms as the engine keeps them (event delay) and Prometheus reads them.

The engine's stats hold per commit clock {"buckets": {"0.005": n, ..., "+Inf": n}, "sum", "count"};
these functions put the buckets in bound order and read a quantile the way Prometheus'
`histogram_quantile` does, so the monitor's series, the pages and the alerts agree.
"""

from __future__ import annotations

import math
from typing import Any


def delay_buckets(stats: dict[str, Any]) -> dict[str, list[tuple[str, float]]]:
    """Per clock, the cumulative delay histogram as (upper bound, count) pairs in bound order."""
    return {clock: sorted(h["buckets"].items(), key=lambda b: math.inf if b[0] == "+Inf" else float(b[0]))
            for clock, h in sorted(stats.get("delay", {}).items())}


def quantile(buckets: list[tuple[str, float]], q: float) -> float | None:
    """The q-quantile of a cumulative histogram, interpolated inside its bucket as Prometheus'
    histogram_quantile does (so the page and the alert agree)."""
    total = buckets[-1][1] if buckets else 0
    if not total:
        return None
    rank, lower, below = q * total, 0.0, 0.0
    for bound, count in buckets:
        upper = math.inf if bound == "+Inf" else float(bound)
        if count >= rank:
            if upper == math.inf:  # in the open-ended bucket: the highest finite bound, as Prometheus says
                return lower
            return lower + (upper - lower) * (rank - below) / (count - below)
        lower, below = upper, count
    return lower


def delay_p99(stats: dict[str, Any], earlier: dict[str, Any] | None = None) -> float | None:
    """The worst 99th percentile of event delay over the commit clocks in use: since the start, or of
    the pairs matched since `earlier` (stats taken then), as Prometheus' rate() over a window would."""
    before = delay_buckets(earlier or {})
    values = []
    for clock, buckets in delay_buckets(stats).items():
        then = dict(before.get(clock, ()))
        if (q := quantile([(b, n - then.get(b, 0)) for b, n in buckets], 0.99)) is not None:
            values.append(q)
    return max(values) if values else None
