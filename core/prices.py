"""The pinned On-Demand price snapshot: the fallback when the live Price List pull fails.

Every row carries the date it was true on and where it came from, so a report that uses
it can say "snapshot, as of DATE" next to the figure.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from core.errors import CampaignError

SNAPSHOT_DIR = Path(__file__).parent / "data"


@dataclass(frozen=True)
class Price:
    kind: str  # instance, ebs, nlb, network
    key: str
    region: str
    usd: float
    unit: str
    as_of: str
    source: str

    @property
    def provenance(self) -> str:
        return f"snapshot {self.as_of}: {self.source}"


class PriceNotFound(CampaignError, LookupError):
    pass


class PriceSnapshotError(CampaignError, ValueError):
    pass


def _parse(path: Path) -> dict[tuple[str, str, str], Price]:
    rows: dict[tuple[str, str, str], Price] = {}
    with path.open(newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        for lineno, row in enumerate(reader, start=2):
            try:
                usd = float(row["usd"])
            except (TypeError, ValueError):
                raise PriceSnapshotError(f"{path}:{lineno}: usd: not a number: {row.get('usd')!r}") from None
            if usd < 0:
                raise PriceSnapshotError(f"{path}:{lineno}: usd: negative price {usd}")
            for col in ("kind", "key", "region", "unit", "as_of", "source"):
                if not row.get(col):
                    raise PriceSnapshotError(f"{path}:{lineno}: {col}: missing")
            price = Price(row["kind"], row["key"], row["region"], usd, row["unit"], row["as_of"], row["source"])
            ident = (price.kind, price.key, price.region)
            if ident in rows:
                raise PriceSnapshotError(f"{path}:{lineno}: duplicate row for {ident}")
            rows[ident] = price
    return rows


@cache
def snapshot(region: str = "us-east-1") -> dict[tuple[str, str, str], Price]:
    path = SNAPSHOT_DIR / f"prices-{region}.csv"
    if not path.exists():
        # Named relative to the package: the message lands in reports, which name no machine's directories.
        shipped = ", ".join(sorted(p.name for p in SNAPSHOT_DIR.glob("prices-*.csv")))
        raise PriceNotFound(
            f"no pinned price snapshot for region {region!r} (looked for core/data/{path.name}; shipped: {shipped})"
        )
    return _parse(path)


def lookup(kind: str, key: str, region: str = "us-east-1") -> Price:
    rows = snapshot(region)
    try:
        return rows[(kind, key, region)]
    except KeyError:
        raise PriceNotFound(f"pinned snapshot has no {kind} price for {key!r} in {region}") from None


def instance_hourly(instance_type: str, region: str = "us-east-1") -> Price:
    return lookup("instance", instance_type, region)
