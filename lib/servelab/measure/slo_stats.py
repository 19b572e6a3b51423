"""The pure statistics of the capacity search (no I/O, no scipy: the GPU device's image has none):
exact binomial tails, the distribution-free order-statistic bounds of a quantile, Kish's design
effect of trials pooled at one load, one-sided Student t quantiles, and the load at which a fitted
line of log p95 against log load crosses the SLO's target (Fieller's interval).
"""

from __future__ import annotations

import functools
import math

ALPHA = 0.05  # one-sided level of every bound here


def _binom_pmf(i: int, n: int, p: float) -> float:
    if p <= 0:
        return 1.0 if i == 0 else 0.0
    if p >= 1:
        return 1.0 if i == n else 0.0
    return math.exp(math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1)
                    + i * math.log(p) + (n - i) * math.log1p(-p))


def binom_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p) (exact sum; no scipy on the GPU device's image)."""
    return min(1.0, sum(_binom_pmf(i, n, p) for i in range(0, min(k, n) + 1))) if k >= 0 else 0.0


def binom_sf(k: int, n: int, p: float) -> float:
    """P(X > k)."""
    return min(1.0, sum(_binom_pmf(i, n, p) for i in range(max(k + 1, 0), n + 1)))


def quantile_bounds(values: list[float], failed: int, q: float, alpha: float = ALPHA,
                    deff: float = 1.0) -> tuple[float, float]:
    """One-sided (1 - alpha) lower and upper confidence bounds of the q-quantile of the requests'
    values (a failed request counts as slower than any): order statistics x_(j) <= Q_q <= x_(k)
    with P(Binomial(m, q) <= k - 1) >= 1 - alpha (k smallest) and P(Binomial(m, q) >= j) >=
    1 - alpha (j largest), where m = n / deff is the effective number of independent requests
    (Kish's design effect: `design_effect`; 1 for independent requests), rank k of m standing for
    the k-th block of n / m requests: its last for an upper bound, its first for a lower one. -inf / inf when m is too small for a
    bound (an upper bound of a p95 needs m >= 59)."""
    xs = sorted(x for x in values if x == x) + [math.inf] * failed
    n = len(xs)
    if n == 0:
        return -math.inf, math.inf
    m = max(1, int(n / max(deff, 1.0)))
    cdf = _cdf(m, q)  # cdf[i] = P(X <= i)
    k = next((k for k in range(1, m + 1) if cdf[k - 1] >= 1 - alpha), None)
    j = next((j for j in range(m, 0, -1) if 1.0 - cdf[j - 1] >= 1 - alpha), None)  # P(X >= j)
    hi = xs[min(n, math.ceil(k * n / m)) - 1] if k else math.inf
    lo = xs[math.floor((j - 1) * n / m)] if j else -math.inf  # the first of the j-th block of n / m
    return lo, hi


def design_effect(groups: list[tuple[list[float], int]], target: float) -> float:
    """How much the trials pooled at one load differ beyond what independent requests explain:
    Kish's design effect of the share of requests over `target`, each trial a cluster (the ratio
    estimator's variance over the binomial one, at least 1; 1 with fewer than two trials, or when
    none or all are over). `groups`: each trial's values and failed count (a failure is over)."""
    ys = [sum(1 for x in xs if x > target) + f for xs, f in groups]
    ns = [sum(1 for x in xs if x == x) + f for xs, f in groups]
    ys, ns = [y for y, n in zip(ys, ns) if n], [n for n in ns if n]
    m, total = len(ns), sum(ns)
    if m < 2:
        return 1.0
    p = sum(ys) / total
    if p <= 0.0 or p >= 1.0:
        return 1.0
    v_cluster = m / (m - 1) * sum((y - p * n) ** 2 for y, n in zip(ys, ns)) / total ** 2
    return max(1.0, v_cluster / (p * (1 - p) / total))


@functools.lru_cache(maxsize=512)
def _cdf(n: int, q: float) -> tuple[float, ...]:
    """P(Binomial(n, q) <= i) for i = 0..n, summed once."""
    out, total = [], 0.0
    for i in range(n + 1):
        total += _binom_pmf(i, n, q)
        out.append(min(1.0, total))
    return tuple(out)


_T95 = (6.314, 2.920, 2.353, 2.132, 2.015, 1.943, 1.895, 1.860, 1.833, 1.812)


def t95(df: int) -> float:
    """One-sided 95 % Student t quantile: a table to 10 df, then Cornish-Fisher (no scipy on the GPU image)."""
    if df <= len(_T95):
        return _T95[max(df, 1) - 1]
    z = 1.6448536269514722
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df * df)


def crossing(xs: list[float], ys: list[float], y0: float) -> dict[str, float] | None:
    """Where the least-squares line of ys on xs reaches y0, with Fieller's one-sided 95 % bounds
    on each side (the x's whose line value is within t(n - 2) standard errors of y0). None with
    fewer than 4 points or 2 distinct xs, or when the line does not rise. The bounds are None when
    the slope is not beyond its own noise (the interval is then unbounded)."""
    n = len(xs)
    if n < 4 or len(set(xs)) < 2:
        return None
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    if b <= 0:
        return None
    sd = math.sqrt(sum((y - my - b * (x - mx)) ** 2 for x, y in zip(xs, ys)) / (n - 2))
    t, d = t95(n - 2), y0 - my
    out = {"estimate": mx + d / b, "lower": None, "upper": None, "slope": b, "sd": sd, "n": n, "df": n - 2}
    a = b * b - (t * sd) ** 2 / sxx
    if a > 0:  # the slope is beyond its noise: a bounded interval
        half = t * sd * math.sqrt(d * d / sxx + a / n)
        out["lower"], out["upper"] = mx + (b * d - half) / a, mx + (b * d + half) / a
    return out
