"""Timing and choosing: the one protocol by which infopt says which of several runners is faster.

Every "which is faster" in infopt goes through :func:`measure` and :func:`choose`: the build's candidates
against eager, the INT8 variants against FP32, the release gate's candidate against its baseline, the
latency-versus-batch curve and the benchmarks.

**The protocol.** At each batch size every runner is warmed up (``warmup`` runs or ``warmup_s`` seconds,
whichever comes first, at least ``min_warmup``). Its timed runs are then split into ``blocks`` blocks, and
the runners take turns block by block, in mirrored order on alternate rounds (A B C, then C B A), so two
consecutive rounds are an ABBA trial for any two runners: a slow spell of the machine lands on every
runner rather than on whichever ran during it, and neither gains from running first. Within a block one
runner runs alone, so neither runtime's idle worker threads (ONNX Runtime spins its pool between runs,
torch's OpenMP pool does too) steal cores from the other's runs for more than a run or two. A block lasts
at least ``min_block_s`` (a fast model runs more times in it), so scheduler ticks and the timer's
resolution wash out.

**The figures.** Per runner, the p50 is the median of the blocks' medians: a stall that spans a whole
block moves one block, not the figure. p90/p99 and the mean are over every run (the tail is what they are
for). Throughput is batch / p50. ``spread`` is how far the block medians lie apart (the most extreme one
of each side left out), relative to the p50; above ``NOISY_SPREAD`` the machine was too noisy for the
figure to be trusted closely. With a ``baseline``, each other runner's time ratio to it is taken per
ABBA trial (its two blocks over the baseline's two in the same two rounds), and the estimate is the
median trial ratio with a distribution-free confidence interval (:func:`median_interval`: the number of
trial ratios below the true median is Binomial(trials, 1/2) whatever the noise looks like).

**Bounds.** Timing stops once the figure is known well enough: after ``MIN_BLOCKS`` rounds (and at the
end of a trial, with a baseline), a runner whose median is pinned within ``tolerance`` of itself runs no
more blocks at that batch size; one that is not keeps going, up to ``iterations`` runs. With a time
budget (``seconds``), each block also ends once its share of the budget is spent, and a runner whose
single runs outlast their share stops once the whole budget is spent and ``min_iterations`` runs are in.
With ``drop_slower``, a runner (not the baseline) whose first block took more than that many times the
fastest other runner's stops being timed after it: it has lost, and :attr:`Timings.dropped` says so.
Where each run is slow, a budget's least runs can fall to one ABBA trial (``least_slow``), or to one pair where
even that would take over twice the budget, the ratio's confidence saying what that is worth, and a feed the
runners have just run at the same shapes (the build's validation) is timed without a warm-up (``warmed``).
The baseline runs as long as any runner it is compared with.

**Choosing.** :func:`choose` takes the ratios and picks the runner with the lowest geometric mean ratio
over batch sizes, each weighted by its share of requests (``--batch-mix``), optionally only where it
beats the baseline (an INT8 variant must beat FP32 to ship).

A runner on a CUDA device is timed with CUDA events around each run, after a synchronize, so the figure
is the GPU's time for the call (copies in and out included), not the host's launch time.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import numpy as np

from infopt.core.manifest_schema import LatencyRow
from infopt.runtime.clocks import cuda_timer, host_timer

BLOCKS = 5
"""blocks each runner's timed runs are split into (fewer when there are fewer runs)"""
NOISY_SPREAD = 0.25
"""block medians further apart than this fraction of the p50 mean the machine was noisy"""
MIN_BLOCKS = 3
"""rounds every runner runs before its timing may stop early"""
TOLERANCE = 0.02
"""stop once the median's 95% confidence interval lies within this fraction of it on either side"""
WARMUP_S = 0.5
MIN_WARMUP = 2
MIN_BLOCK_S = 0.01
"""a timed block lasts at least this long, so scheduler ticks and timer resolution wash out"""
MAX_BLOCK_RUNS = 1000
DROP_SLOWER = 1.5
"""a build's candidate whose first block takes this many times the fastest candidate's is timed no further"""

Timer = Callable[[Callable[[dict], object], dict], float]


class LatencyStats(LatencyRow):
    """One runner's timing at one batch size: the manifest's latency row (``core/manifest_schema.py``
    declares its fields), and whether the machine was too noisy to trust it closely."""

    @property
    def noisy(self) -> bool:
        return self.spread > NOISY_SPREAD

    def to_json(self) -> dict:
        return self.model_dump()


@dataclass
class RatioEstimate:
    """A runner's time over the baseline's at one batch size, from paired (ABBA) trials."""

    batch: int
    candidate_p50_ms: float
    """the runner's time in the median trial (the mean of its two block medians there)"""
    baseline_p50_ms: float
    """the baseline's time in the same trial"""
    ratio: float
    """the median over trials of runner time / baseline time: exactly candidate_p50_ms / baseline_p50_ms,
    the two figures shown beside it (with an even number of trials, the lower of the middle two)"""
    lower: float
    upper: float
    confidence: float
    """the probability with which each of ``lower`` and ``upper`` bounds the true median ratio"""
    trials: int
    iterations: int
    """runs in each of the runner's blocks"""

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class Timings:
    """What :func:`measure` found: each runner's figures per batch size, and each one's ratios to the baseline."""

    stats: list[LatencyStats]
    ratios: dict[str, list[RatioEstimate]] = field(default_factory=dict)
    """runner -> its ratio to the baseline at each batch size (empty without a baseline)"""
    dropped: dict[str, str] = field(default_factory=dict)
    """runner -> why it stopped being timed after its first block"""

    def of(self, runner: str) -> list[LatencyStats]:
        return [s for s in self.stats if s.runner == runner]


def summarize(runner: str, batch: int, seconds: list[float], block_medians: list[float] | None = None) -> LatencyStats:
    """Statistics of one runner's runs at one batch size (``block_medians`` in seconds, one per block)."""
    ms = np.asarray(seconds) * 1e3
    blocks = np.asarray(block_medians) * 1e3 if block_medians else np.asarray([np.median(ms)])
    p50 = float(np.median(blocks))
    p90, p99 = (max(p50, float(v)) for v in np.percentile(ms, [90, 99]))
    kept = np.sort(blocks)[1:-1] if len(blocks) >= 4 else blocks  # one odd block is what the median is for
    spread = float((kept.max() - kept.min()) / p50) if p50 > 0 else 0.0
    return LatencyStats(runner=runner, batch=batch, p50_ms=p50, p90_ms=p90, p99_ms=max(p90, p99), mean_ms=float(ms.mean()),
                        throughput=batch / (p50 / 1e3) if p50 > 0 else 0.0, iterations=len(ms), blocks=len(blocks),
                        spread=spread)


def median_pinned(seconds: list[float], tolerance: float, z: float = 1.96) -> bool:
    """Whether the distribution-free confidence interval of the median (order statistics
    ``n/2 -+ z*sqrt(n)/2``) lies within ``tolerance`` of the median on both sides."""
    n = len(seconds)
    if n < 5 or tolerance <= 0:
        return False
    ordered = sorted(seconds)
    half = z * n**0.5 / 2
    lo, hi = ordered[max(0, int(n / 2 - half))], ordered[min(n - 1, int(np.ceil(n / 2 + half)))]
    middle = float(np.median(ordered))
    return middle > 0 and (middle - lo) <= tolerance * middle and (hi - middle) <= tolerance * middle


def median_interval(values: list[float], confidence: float) -> tuple[float, float, float]:
    """(lower, upper, achieved): one-sided confidence bounds for the median of ``values``'
    distribution, each holding with probability ``achieved`` >= ``confidence`` (when there are
    enough values; else the extremes). They are the order statistics x(k) and x(n+1-k) for the
    largest k with P(Binomial(n, 1/2) <= k - 1) <= 1 - confidence."""
    data = sorted(values)
    n = len(data)
    best, tail = 1, 1 / 2 ** n
    below = 0.0
    for k in range(1, n // 2 + 1):
        below += math.comb(n, k - 1) / 2 ** n  # P(Binomial(n, 1/2) <= k - 1)
        if below > 1 - confidence:
            break
        best, tail = k, below
    return data[best - 1], data[n - best], 1 - tail


def weighted_geomean(values: dict[int, float], weights: dict[int, float] | None = None) -> float | None:
    """exp of the weighted mean log of ``values`` (batch size -> a time ratio or a speedup), each batch size
    weighted by its share of requests (``--batch-mix``); equal weights without ``weights``. None when no value
    has a weight."""
    shares = {b: (weights or {}).get(b, 0.0 if weights else 1.0) for b in values}
    total = sum(shares.values())
    if total <= 0:
        return None
    return math.exp(sum(shares[b] * math.log(v) for b, v in values.items()) / total)


def mix_text(weights: dict[int, float]) -> str:
    """``1: 70%, 32: 30%``: a declared batch mix, as the selection notes name it."""
    return ", ".join(f"{b}: {w:.0%}" for b, w in weights.items())


def _block_sizes(iterations: int, blocks: int) -> list[int]:
    count = max(1, min(blocks, iterations))
    return [iterations // count + (1 if k < iterations % count else 0) for k in range(count)]


def _warm(fn: Callable[[dict], object], feed: dict, runs: int, least: int, seconds: float, clock: Timer) -> list[float]:
    """Warm-up runs, timed: their times size the blocks."""
    times: list[float] = []
    start = time.perf_counter()
    for k in range(runs):
        if k >= least and time.perf_counter() - start >= seconds:
            break
        times.append(clock(fn, feed))
    return times


def _block_runs(warm: list[float], size: int, min_block_s: float) -> int:
    """``size``, raised so that a block lasts ``min_block_s`` at the warm-up's pace (its first run left out)."""
    pace = min(warm[1:] or warm) if warm else 0.0
    if min_block_s <= 0 or not warm:
        return size
    if pace <= 0:
        return MAX_BLOCK_RUNS
    return int(min(max(size, math.ceil(min_block_s / pace)), MAX_BLOCK_RUNS))


def _trial_ratios(mine: dict[int, float], base: dict[int, float]) -> tuple[list[tuple[float, float, float]], bool]:
    """(ratio, my ms, baseline ms) per ABBA trial: rounds 2j and 2j+1 where both ran; one round when no pair is whole
    (then False: the ratios carry the order the runners ran in)."""
    pairs = [(k, k + 1) for k in range(0, max(mine, default=0) + 1, 2) if all(r in mine and r in base for r in (k, k + 1))]
    paired = bool(pairs)
    if not pairs:
        pairs = [(k,) for k in mine if k in base]
    found = []
    for rounds in pairs:
        m, b = sum(mine[r] for r in rounds) / len(rounds), sum(base[r] for r in rounds) / len(rounds)
        found.append((m / b if b > 0 else math.inf, m * 1e3, b * 1e3))
    return found, paired


def _ratio(batch: int, trials: list[tuple[float, float, float]], paired: bool, confidence: float,
           runs: int) -> RatioEstimate:
    """``paired`` False: the trials are single rounds (no whole ABBA trial), whose ratios carry the order they ran
    in: no confidence is claimed."""
    ratios = [t[0] for t in trials]
    lower, upper, coverage = median_interval(ratios, confidence)
    coverage = coverage if paired else 0.0
    middle = trials[ratios.index(statistics.median_low(ratios))]
    return RatioEstimate(batch, middle[1], middle[2], middle[0], lower, upper, coverage, len(trials), runs)


def measure(runners: dict[str, Callable[[dict], object]], feeds: dict[int, dict[str, np.ndarray]], *,
            warmup: int = 10, iterations: int = 50, blocks: int = BLOCKS, seconds: float | None = None,
            min_iterations: int = 5, tolerance: float = TOLERANCE, min_warmup: int = MIN_WARMUP,
            warmup_s: float = WARMUP_S, min_block_s: float = MIN_BLOCK_S, baseline: str | None = None,
            confidence: float = 0.95, drop_slower: float | None = None, devices: dict[str, str] | None = None,
            timer: Timer | None = None, progress: Callable[[str], None] | None = None,
            clocks: dict[str, Timer] | None = None, warmed: dict[int, float] | None = None,
            least_slow: int | None = None) -> Timings:
    """Time every runner (name -> callable taking a feed) at every batch size in ``feeds`` by the module's
    protocol. ``iterations`` runs per runner split into ``blocks`` (each raised to last ``min_block_s``);
    ``devices`` names the runners that run on ``cuda`` (timed with CUDA events; the rest on the host
    clock), ``timer(fn, feed)`` replaces both, and ``clocks`` replaces them for the runners it names (a worker
    process's runner, timed where it runs: ``Runner.clock``). ``tolerance`` 0 never stops early; ``seconds`` bounds each
    runner's time per batch size (at least ``min_iterations`` runs); ``baseline`` names the runner the others'
    ratios are taken to; ``drop_slower`` stops a runner that lost clearly after its first block. ``warmed`` maps
    the batch sizes whose feed every runner has just run (the build's validation, at the same shapes) to the
    seconds one run took there: where that is at least ``warmup_s``, no warm-up runs there. With ``seconds`` and
    ``least_slow``, a runner whose first block shows that ``min_iterations`` runs would take over twice
    ``seconds`` keeps at least ``least_slow`` runs instead (2: one ABBA trial, its ratio's confidence 50 %), and
    one whose ``least_slow`` runs would too keeps its first block's one run (the ratio then that of one pair, the
    baseline run first)."""
    names = list(runners)
    sizes = _block_sizes(iterations, blocks)
    floor = -(-min_iterations // len(sizes))  # runs every block keeps under a time budget
    clocks = {n: (clocks or {}).get(n) or timer or (cuda_timer if (devices or {}).get(n) == "cuda" else host_timer)
              for n in names}
    found = Timings([])
    for batch, feed in feeds.items():
        warm = (warmed or {}).get(batch, 0.0) < warmup_s  # a feed the runners just ran slowly needs no warm-up
        runs = {n: _block_runs(_warm(runners[n], feed, warmup, min_warmup, warmup_s, clocks[n]) if warm else [], 1,
                               min_block_s) for n in names}
        least = dict.fromkeys(names, min_iterations)
        times: dict[str, list[float]] = {n: [] for n in names}
        medians: dict[str, dict[int, float]] = {n: {} for n in names}
        spent = {n: 0.0 for n in names}
        active = list(names)
        for k, size in enumerate(sizes):
            if progress:
                progress(f"latency: batch {batch}, block {k + 1}/{len(sizes)}")
            for name in active if k % 2 == 0 else list(reversed(active)):
                block: list[float] = []
                start = time.perf_counter()
                while len(block) < max(size, runs[name]):
                    block.append(clocks[name](runners[name], feed))
                    if seconds is not None and len(block) >= floor and time.perf_counter() - start >= seconds / len(sizes):
                        break
                spent[name] += time.perf_counter() - start
                times[name] += block
                medians[name][k] = float(np.median(block))
                if k == 0 and least_slow and seconds is not None and medians[name][0] * min_iterations > 2 * seconds:
                    # and where even those would take over twice the budget, this block's one run: a single pair
                    slower = medians[name][0] * least_slow > 2 * seconds
                    least[name] = 1 if slower else min(min_iterations, least_slow)
            if k == 0 and drop_slower:
                _drop_losers(active, medians, baseline, drop_slower, found.dropped)
            # a runner slower than its blocks' share: done once the budget is spent and the least runs are in
            active = [n for n in active if seconds is None or spent[n] < seconds or len(times[n]) < least[n]]
            if k + 1 >= MIN_BLOCKS and (baseline is None or (k + 1) % 2 == 0):
                active = [n for n in active if not median_pinned(times[n], tolerance)]
            if baseline is not None and any(n != baseline for n in active):
                active = [n for n in names if n in active or n == baseline]  # the others' trials need it beside them
            if not active or (active == [baseline] and len(names) > 1):
                break
        found.stats += [summarize(n, batch, times[n], list(medians[n].values())) for n in names]
        if baseline is not None:
            for n in names:
                if n != baseline:
                    found.ratios.setdefault(n, []).append(
                        _ratio(batch, *_trial_ratios(medians[n], medians[baseline]), confidence, max(sizes[0], runs[n])))
    return found


def _drop_losers(active: list[str], medians: dict[str, dict[int, float]], baseline: str | None, factor: float,
                 dropped: dict[str, str]) -> None:
    """Take out of ``active`` every runner but the baseline whose first block took over ``factor`` times the fastest's."""
    others = [n for n in active if n != baseline]
    if len(others) < 2:
        return
    fastest = min(others, key=lambda n: medians[n][0])
    for name in others:
        slower = medians[name][0] / medians[fastest][0] if medians[fastest][0] > 0 else 1.0
        if slower > factor:
            active.remove(name)
            dropped.setdefault(name, f"timed for one block only: its first took {slower:.1f}x {fastest}'s, "
                                     f"past the {factor:g}x at which a runner has clearly lost")


@dataclass
class Choice:
    """What :func:`choose` picked, and the figure it picked by."""

    name: str | None
    """the runner to use, or None where the baseline won"""
    ratio: float | None
    """the chosen runner's (or, where the baseline won, the best other's) weighted geometric-mean time ratio"""
    best: str | None
    """the fastest runner other than the baseline"""


def choose(ratios: dict[str, list[RatioEstimate]], weights: dict[int, float] | None = None, *,
           among: list[str] | None = None, must_beat_baseline: bool = False) -> Choice:
    """The runner (of ``among``, default all) with the lowest geometric-mean ratio to the baseline over batch
    sizes, each weighted by its share of requests when ``weights`` (``--batch-mix``) declares them. With
    ``must_beat_baseline``, the baseline is chosen (name None) unless that ratio is below 1."""
    scores = {n: weighted_geomean({r.batch: r.ratio for r in ratios[n]}, weights)
              for n in (among if among is not None else ratios) if ratios.get(n)}
    scores = {n: s for n, s in scores.items() if s is not None}
    if not scores:
        return Choice(None, None, None)
    best = min(scores, key=scores.__getitem__)
    if must_beat_baseline and scores[best] >= 1.0:
        return Choice(None, scores[best], best)
    return Choice(best, scores[best], best)


def worker_clocks(**runners) -> dict[str, Timer]:
    """The clocks of the runners (by name) that time their runs where they run (``Runner.clock``), for
    :func:`measure`'s ``clocks``."""
    return {name: runner.clock for name, runner in runners.items() if getattr(runner, "clock", None)}


def paired(candidate: Callable[[dict], object], baseline: Callable[[dict], object], feeds: dict[int, dict[str, np.ndarray]],
           *, trials: int = 15, runs: int = 10, warmup: int = 5, confidence: float = 0.95, cuda: bool = False,
           timer: Timer | None = None, progress: Callable[[str], None] | None = None,
           clocks: dict[str, Timer] | None = None) -> list[RatioEstimate]:
    """The candidate's time ratio to the baseline at each batch size (the release gate's question): :func:`measure`
    of the two, ``trials`` ABBA trials of blocks of at least ``runs`` runs, none stopped early; ``clocks`` by
    ``candidate`` and ``baseline`` as :func:`measure` takes them."""
    found = measure({"baseline": baseline, "candidate": candidate}, feeds, warmup=warmup, iterations=2 * trials * runs,
                    blocks=2 * trials, tolerance=0, baseline="baseline", confidence=confidence,
                    devices=dict.fromkeys(("baseline", "candidate"), "cuda") if cuda else None, timer=timer,
                    progress=progress, clocks=clocks)
    return found.ratios["candidate"]
