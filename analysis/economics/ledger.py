"""Migration ledger and payback (docs/design.md: migration cost, monthly delta, payback months).

Rule for the capacity items (documented because docs/design.md names them but not their formula):
- dual_run: the full candidate fleet runs for dual_run_days while the baseline still serves.
- shadow: shadow_capacity_fraction of the candidate fleet on top, during the dual run.
- canary: canary_capacity_fraction of the candidate fleet on top, during the dual run.
- rollback_retention: the baseline fleet kept whole for rollback_retention_days after cut-over.
A "day" is hours_per_month / 24 of a month's cost, so a fleet that runs 730 h/month costs
1/30.4 of its monthly cost per day.
"""

from __future__ import annotations

from analysis.model import Ledger
from core.manifest import Migration

# The ledger items priced from the sized fleets' monthly costs (the rest are the manifest's own
# figures): a report whose fleet sizes are not decided cannot state these.
FLEET_COST_ITEMS = frozenset({"dual_run", "shadow", "canary", "rollback_retention"})


def migration_ledger(
    mig: Migration,
    *,
    candidate_monthly_usd: float,
    baseline_monthly_usd: float,
    hours_per_month: float,
    effort_scale: float = 1.0,
) -> Ledger:
    days_per_month = hours_per_month / 24.0
    cand_day = candidate_monthly_usd / days_per_month
    base_day = baseline_monthly_usd / days_per_month
    items = {
        f"labor:{name}": hours * effort_scale * mig.loaded_rate_usd_per_hour
        for name, hours in mig.activities_hours.items()
    }
    items.update(
        testing=mig.testing_usd,
        tooling=mig.tooling_usd,
        training=mig.training_usd,
        dual_run=cand_day * mig.dual_run_days,
        shadow=cand_day * mig.dual_run_days * mig.shadow_capacity_fraction,
        canary=cand_day * mig.dual_run_days * mig.canary_capacity_fraction,
        rollback_retention=base_day * mig.rollback_retention_days,
    )
    return Ledger(items_usd=items, total_usd=sum(items.values()))  # report.json's migration, as computed


def monthly_delta(baseline_monthly_usd: float, candidate_monthly_usd: float) -> float:
    """Baseline (e.g. G6) monthly minus candidate (e.g. Inf2) monthly: positive means the move saves."""
    return baseline_monthly_usd - candidate_monthly_usd


def payback_months(migration_cost_usd: float, delta_usd: float) -> float | None:
    return migration_cost_usd / delta_usd if delta_usd > 0 else None


def payback_curve(migration_cost_usd: float, delta_usd: float, months: int) -> list[tuple[float, float]]:
    """Cumulative net savings after m months: -migration cost + m x delta."""
    return [(m, -migration_cost_usd + m * delta_usd) for m in range(months + 1)]
