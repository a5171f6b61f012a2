"""When a difference in `val_bpb` is more than noise: the spread of reruns of one config, and the ledger's rule.

Two runs of the same config differ: another seed draws other weights and another batch order, and a run on a
time budget trains more or fewer steps as the machine is busier or idler. The ledger measures that spread from
reruns (runs whose config is their parent's but for the seed), pooled over every config rerun at one dataset and
budget, and calls a change beyond noise only when its delta (the mean of its runs minus its parent's mean) is beyond
what two runs of one config would differ by at 95% confidence:

    |delta| > t(0.975, dof) · sigma · sqrt(1/n_run + 1/n_parent)

sigma is the pooled standard deviation of one run, `dof` its degrees of freedom, n the runs averaged on each side,
and t Student's quantile at `dof`, the reruns behind sigma (each config's runs less one): about 2 once a dozen
reruns back sigma and wider before (3.2 with three). With few reruns sigma itself is uncertain: a bare 2-sigma rule
would call 17% of identical pairs different with three reruns (a run against a baseline of four). Fewer than
`MIN_RERUNS` reruns decide nothing.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass

DECISION_METRIC = "val_bpb"  # what the ledger ranks and judges by (`TrainSummary.val_bpb`)
MIN_RERUNS = 3  # reruns behind a sigma the ledger decides with
CONFIDENCE = 0.95


@dataclass(frozen=True)
class Noise:
    """The spread of one run's val_bpb at a dataset and budget, from the configs rerun there."""

    sigma: float | None  # pooled standard deviation; None without a rerun
    reruns: int  # the runs of rerun configs less one per config: sigma's degrees of freedom

    @property
    def measured(self) -> bool:
        """Whether enough reruns back sigma to decide with it."""
        return self.sigma is not None and self.reruns >= MIN_RERUNS

    def threshold(self, runs: int, parent_runs: int) -> float:
        """The |delta| beyond which the mean of `runs` runs differs from the mean of `parent_runs` beyond noise."""
        from scipy.stats import t  # scipy comes with JAX; imported here, as few calls decide anything

        assert self.sigma is not None
        quantile = float(t.ppf(1 - (1 - CONFIDENCE) / 2, self.reruns))
        return quantile * self.sigma * math.sqrt(1 / runs + 1 / parent_runs)


def pooled(groups: Iterable[list[float]]) -> Noise:
    """The pooled spread of `groups`, each the val_bpb of the runs of one config."""
    rerun = [values for values in groups if len(values) >= 2]
    reruns = sum(len(values) - 1 for values in rerun)
    if reruns == 0:
        return Noise(sigma=None, reruns=0)
    squares = sum((value - statistics.fmean(values)) ** 2 for values in rerun for value in values)
    return Noise(sigma=math.sqrt(squares / reruns), reruns=reruns)
