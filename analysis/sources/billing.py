"""What was actually billed: Cost Explorer grouped by the `campaign` and `fleet` tags, or a
FOCUS (FinOps Open Cost and Usage Specification) export CSV."""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from analysis.errors import BadBillingData, SourceUnavailable

FOCUS_COLUMNS = (
    "ChargePeriodStart",
    "EffectiveCost",
    "BilledCost",
    "ResourceId",
    "Tags",
    "ServiceName",
    "CommitmentDiscountId",
)


@dataclass
class FleetBill:
    effective_usd: float = 0.0
    billed_usd: float = 0.0
    rows: int = 0
    commitment_rows: int = 0  # rows covered by a Savings Plan / RI (CommitmentDiscountId set)
    resources: int = 0

    def as_dict(self) -> dict[str, object]:
        return dict(self.__dict__)


def cost_explorer_by_fleet(ce: Any, campaign: str, start_date: str, end_date: str) -> dict[str, float]:
    """Unblended cost per `fleet` tag value for resources tagged campaign=<campaign>."""
    out: dict[str, float] = {}
    token = None
    try:
        while True:
            kw: dict[str, Any] = {
                "TimePeriod": {"Start": start_date, "End": end_date},
                "Granularity": "DAILY",
                "Metrics": ["UnblendedCost"],
                "Filter": {"Tags": {"Key": "campaign", "Values": [campaign], "MatchOptions": ["EQUALS"]}},
                "GroupBy": [{"Type": "TAG", "Key": "fleet"}],
            }
            if token:
                kw["NextPageToken"] = token
            resp = ce.get_cost_and_usage(**kw)
            for period in resp.get("ResultsByTime", []):
                for g in period.get("Groups", []):
                    key = g["Keys"][0]
                    fleet = key.split("$", 1)[1] if "$" in key else key  # CE returns "fleet$<value>"
                    amount = g.get("Metrics", {}).get("UnblendedCost", {}).get("Amount")
                    if amount is None:
                        continue
                    out[fleet or "(untagged)"] = out.get(fleet or "(untagged)", 0.0) + float(amount)
            token = resp.get("NextPageToken")
            if not token:
                break
    except Exception as exc:  # botocore
        raise SourceUnavailable(f"Cost Explorer GetCostAndUsage: {type(exc).__name__}: {exc}") from None
    return out


def _num(value: str, path: Path, line: int, col: str) -> float:
    try:
        return float(value) if value != "" else 0.0
    except ValueError:
        raise BadBillingData(f"{path}:{line}: {col}: not a number: {value!r}") from None


def read_focus(path: str | Path, campaign: str) -> dict[str, FleetBill]:
    """Sum a FOCUS export's costs per `fleet` tag for rows tagged campaign=<campaign>."""
    p = Path(path)
    out: dict[str, FleetBill] = {}
    resources: dict[str, set[str]] = {}
    with p.open(newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in FOCUS_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise BadBillingData(f"{p}: FOCUS export lacks column(s): {', '.join(missing)}")
        for line, row in enumerate(reader, start=2):
            try:
                tags = json.loads(row["Tags"]) if row["Tags"] else {}
            except ValueError:
                raise BadBillingData(f"{p}:{line}: Tags: not a JSON object: {row['Tags']!r}") from None
            if not isinstance(tags, dict) or tags.get("campaign") != campaign:
                continue
            fleet = str(tags.get("fleet", "(untagged)"))
            b = out.setdefault(fleet, FleetBill())
            b.effective_usd += _num(row["EffectiveCost"], p, line, "EffectiveCost")
            b.billed_usd += _num(row["BilledCost"], p, line, "BilledCost")
            b.rows += 1
            b.commitment_rows += bool(row["CommitmentDiscountId"])
            resources.setdefault(fleet, set()).add(row["ResourceId"])
    for fleet, rs in resources.items():
        out[fleet].resources = len(rs)
    return out
