"""Unit prices: the AWS Price List API (`pricing` GetProducts), falling back to the pinned snapshot.

Every price carries its provenance: "pulled" with the SKU and the day it was pulled, or
"snapshot" with the snapshot's as-of date. A price neither source has is a PriceMissing
error (the report marks the gap); it is never read as 0.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from analysis.errors import PriceMissing, SourceUnavailable
from analysis.provenance import Sourced
from core import prices

# The Price List API filters on the region's long name, not its code.
REGION_NAMES: dict[str, str] = {
    "us-east-1": "US East (N. Virginia)",
    "us-east-2": "US East (Ohio)",
    "us-west-2": "US West (Oregon)",
    "eu-west-1": "EU (Ireland)",
    "eu-central-1": "EU (Frankfurt)",
    "ap-northeast-1": "Asia Pacific (Tokyo)",
    "ap-south-1": "Asia Pacific (Mumbai)",
    "ap-southeast-2": "Asia Pacific (Sydney)",
    "sa-east-1": "South America (Sao Paulo)",
}
# The Price List API is served from us-east-1 (and ap-south-1); prices for every region live there.
PRICING_ENDPOINT_REGION = "us-east-1"


def _term(field_name: str, value: str) -> dict[str, str]:
    return {"Type": "TERM_MATCH", "Field": field_name, "Value": value}


def ec2_instance_filters(instance_type: str, location: str) -> list[dict[str, str]]:
    return [
        _term("instanceType", instance_type),
        _term("location", location),
        _term("operatingSystem", "Linux"),
        _term("tenancy", "Shared"),
        _term("preInstalledSw", "NA"),
        _term("capacitystatus", "Used"),
    ]


def ebs_gp3_filters(location: str) -> list[dict[str, str]]:
    return [_term("productFamily", "Storage"), _term("volumeApiName", "gp3"), _term("location", location)]


def nlb_filters(location: str) -> list[dict[str, str]]:
    return [_term("productFamily", "Load Balancer-Network"), _term("location", location)]


@dataclass(frozen=True)
class ListedPrice:
    usd: float
    unit: str
    sku: str
    usagetype: str
    description: str


def parse_price_list(items: list[str]) -> list[ListedPrice]:
    """Parse GetProducts' PriceList (each element a JSON string) into On-Demand USD prices.

    Only positive prices are kept: a 0.00 dimension (free tier, a zero-priced usage type) is
    not the price of the thing and must not be mistaken for it.
    """
    out: list[ListedPrice] = []
    for raw in items:
        doc = json.loads(raw) if isinstance(raw, str) else raw
        product = doc.get("product", {})
        attrs = product.get("attributes", {})
        for term in doc.get("terms", {}).get("OnDemand", {}).values():
            for dim in term.get("priceDimensions", {}).values():
                usd_s = dim.get("pricePerUnit", {}).get("USD")
                if usd_s is None:
                    continue
                usd = float(usd_s)
                if usd > 0:
                    out.append(
                        ListedPrice(
                            usd,
                            dim.get("unit", ""),
                            product.get("sku", ""),
                            attrs.get("usagetype", ""),
                            dim.get("description", ""),
                        )
                    )
    return out


# The commitment rate a rate cell uses when the manifest has none: a 1-year, No Upfront,
# Standard Reserved Instance (its hourly rate is the whole price; nothing is paid upfront).
# Term attribute names and values as GetProducts returns them under terms.Reserved.
RESERVED_TERM = {"LeaseContractLength": "1yr", "PurchaseOption": "No Upfront", "OfferingClass": "standard"}


def parse_reserved(items: list[str], term: dict[str, str] | None = None) -> list[ListedPrice]:
    """Hourly USD of the Reserved terms whose termAttributes match `term` (default RESERVED_TERM)."""
    want = term or RESERVED_TERM
    out: list[ListedPrice] = []
    for raw in items:
        doc = json.loads(raw) if isinstance(raw, str) else raw
        product = doc.get("product", {})
        attrs = product.get("attributes", {})
        for t in doc.get("terms", {}).get("Reserved", {}).values():
            if any(t.get("termAttributes", {}).get(k) != v for k, v in want.items()):
                continue
            for dim in t.get("priceDimensions", {}).values():
                usd_s = dim.get("pricePerUnit", {}).get("USD")
                if dim.get("unit") == "Hrs" and usd_s is not None and float(usd_s) > 0:
                    out.append(
                        ListedPrice(
                            float(usd_s),
                            "Hrs",
                            product.get("sku", ""),
                            attrs.get("usagetype", ""),
                            dim.get("description", ""),
                        )
                    )
    return out


class PriceListSource:
    """GetProducts over the AWS Price List API, paginated."""

    def __init__(self, client: Any, region: str):
        if region not in REGION_NAMES:
            raise PriceMissing(f"no Price List location name known for region {region!r}")
        self.client = client
        self.region = region
        self.location = REGION_NAMES[region]
        self._seen: dict[str, list[str]] = {}

    def _products(self, service: str, filters: list[dict[str, str]]) -> list[ListedPrice]:
        return parse_price_list(self._items(service, filters))

    def _items(self, service: str, filters: list[dict[str, str]]) -> list[str]:
        """GetProducts' PriceList for one query, asked once (On-Demand and Reserved read the same items)."""
        key = json.dumps([service, filters], sort_keys=True)
        if key in self._seen:
            return self._seen[key]
        items: list[str] = []
        token: str | None = None
        try:
            while True:
                kw: dict[str, Any] = {
                    "ServiceCode": service,
                    "Filters": filters,
                    "FormatVersion": "aws_v1",
                    "MaxResults": 100,
                }
                if token:
                    kw["NextToken"] = token
                resp = self.client.get_products(**kw)
                items.extend(resp.get("PriceList", []))
                token = resp.get("NextToken")
                if not token:
                    break
        except Exception as exc:  # botocore raises many unrelated types (credentials, endpoint, client errors)
            raise SourceUnavailable(f"Price List API {service}: {type(exc).__name__}: {exc}") from None
        self._seen[key] = items
        return items

    @staticmethod
    def _one(found: list[ListedPrice], what: str) -> ListedPrice:
        distinct = {p.usd for p in found}
        if not found:
            raise PriceMissing(f"Price List API returned no On-Demand price for {what}")
        if len(distinct) > 1:
            raise PriceMissing(
                f"Price List API returned {len(distinct)} different prices for {what}: {sorted(distinct)}"
            )
        return found[0]

    def instance_hourly(self, instance_type: str) -> ListedPrice:
        found = [
            p
            for p in self._products("AmazonEC2", ec2_instance_filters(instance_type, self.location))
            if p.unit == "Hrs"
        ]
        return self._one(found, f"{instance_type} Linux Shared in {self.location}")

    def instance_reserved_hourly(self, instance_type: str) -> ListedPrice:
        found = parse_reserved(self._items("AmazonEC2", ec2_instance_filters(instance_type, self.location)))
        what = f"{instance_type} Linux Shared in {self.location}, Reserved {RESERVED_TERM}"
        if not found:
            raise PriceMissing(f"Price List API returned no Reserved price for {what}")
        return self._one(found, what)

    def ebs_gp3_gb_month(self) -> ListedPrice:
        found = [
            p for p in self._products("AmazonEC2", ebs_gp3_filters(self.location)) if p.unit.lower().startswith("gb")
        ]
        return self._one(found, f"EBS gp3 GB-month in {self.location}")

    def nlb(self, which: str) -> ListedPrice:
        suffix = {"hour": "LoadBalancerUsage", "lcu-hour": "LCUUsage"}[which]
        found = [p for p in self._products("AWSELB", nlb_filters(self.location)) if p.usagetype.endswith(suffix)]
        return self._one(found, f"NLB {which} in {self.location}")


RESERVED_KIND = "instance-reserved-1yr-no-upfront"  # PriceBook kind of RESERVED_TERM's hourly rate


@dataclass
class PriceBook:
    """Resolves each price once: the API when asked for, else (or on failure) the snapshot."""

    region: str
    api: PriceListSource | None = None
    today: str = field(default_factory=lambda: dt.date.today().isoformat())
    notes: list[str] = field(default_factory=list)
    _cache: dict[tuple[str, str], Sourced] = field(default_factory=dict)

    def _pull(self, kind: str, key: str) -> Callable[[], ListedPrice] | None:
        api = self.api
        if api is None:
            return None
        if kind == "instance":
            return lambda: api.instance_hourly(key)
        if kind == RESERVED_KIND:
            return lambda: api.instance_reserved_hourly(key)
        if (kind, key) == ("ebs", "gp3-storage"):
            return api.ebs_gp3_gb_month
        if kind == "nlb":
            return lambda: api.nlb(key)
        return None  # inter-AZ transfer is not a GetProducts lookup we trust; the snapshot answers

    def get(self, kind: str, key: str) -> Sourced:
        if (kind, key) in self._cache:
            return self._cache[(kind, key)]
        pull = self._pull(kind, key)
        api_problem = ""
        if pull is not None:
            try:
                lp = pull()
                got = Sourced(
                    lp.usd,
                    "pulled",
                    f"AWS Price List API {self.today}: sku {lp.sku} {lp.unit} {lp.description}".strip(),
                )
                self._cache[(kind, key)] = got
                return got
            except (SourceUnavailable, PriceMissing) as exc:
                api_problem = f"{exc}; "
                self.notes.append(f"{kind} {key}: {exc}; fell back to the snapshot")
        try:
            p = prices.lookup(kind, key, self.region)
        except prices.PriceNotFound as exc:
            raise PriceMissing(f"{api_problem}{exc}") from None
        got = Sourced(p.usd, "snapshot", p.provenance)
        self._cache[(kind, key)] = got
        return got
