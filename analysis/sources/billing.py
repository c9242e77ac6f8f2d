"""What was actually billed: Cost Explorer grouped by the `campaign` and `fleet` tags, or a
FOCUS (FinOps Open Cost and Usage Specification) export CSV, local or in S3 (one object, or every
part under a prefix); each limited to the run's own window where the source's resolution allows.
Also what tells when the bill cannot be known yet: the tags' cost-allocation activation (`deploy`
asks, `plan` names them), Cost Explorer's `Estimated` mark, and what its requests cost."""

from __future__ import annotations

import csv
import datetime as dt
import gzip
import io
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

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
# FOCUS 1.0 (focus.finops.org, spec "Charge Period End"): the exclusive end of the row's charge
# period; needed only to limit the export to the run's window (ChargePeriodStart is its inclusive start).
FOCUS_PERIOD_END = "ChargePeriodEnd"

# Cost Explorer GetCostAndUsage (docs.aws.amazon.com/aws-cost-management/latest/APIReference/
# API_GetCostAndUsage.html, "Granularity" and "TimePeriod"): HOURLY needs hourly granularity
# enabled on the account's Cost Explorer settings page and reaches back 14 days only, with
# TimePeriod in yyyy-MM-ddThh:mm:ssZ; DAILY takes yyyy-MM-dd, whole UTC days. Start inclusive, end exclusive.
HOURLY_LOOKBACK = dt.timedelta(days=14)

# Cost Explorer groups cost only by cost allocation tags that are activated, and only over the
# data it has refreshed, so an answer with no rows says the bill is not known yet, never that it
# is 0 USD: AWS Billing User Guide, "Activating user-defined cost allocation tags" (a tag takes up
# to 24 hours to activate, and only then appears in Cost Explorer), and AWS Cost Management User
# Guide, "Analyzing your costs and usage with AWS Cost Explorer" (the cost data is refreshed at
# least once every 24 hours).
NO_ROWS = (
    "Cost Explorer returned no rows for the run's tags (campaign={campaign}, grouped by fleet) between "
    "{start} and {end} ({granularity}, end exclusive): cost-allocation tags may not be activated yet, or "
    "the data not yet refreshed (up to 24 h)"
)

# The tags the bill is read by: Cost Explorer filters on `campaign` and groups by `fleet`, which it
# does only once both are activated as cost allocation tags (NO_ROWS' sources), and a tag can be
# activated only once resources carry it and it has reached the billing data.
COST_ALLOCATION_TAGS = ("campaign", "fleet")

# AWS Cost Explorer pricing page (aws.amazon.com/aws-cost-management/aws-cost-explorer/pricing/),
# "AWS Cost Explorer API": each request incurs a cost of 0.01 USD; a paginated answer is one request
# per page (GetCostAndUsage's NextPageToken).
CE_REQUEST_USD = 0.01

# Cost Explorer refreshes its data up to 24 h after usage (NO_ROWS' sources): a bill pulled sooner
# after the window ended may still grow.
REFRESH_HOURS = 24.0


def activation_advice(keys: Iterable[str] = COST_ALLOCATION_TAGS) -> str:
    """How to activate the tags, in the words `plan` and `deploy` print."""
    listed = " ".join(f"TagKey={k},Status=Active" for k in keys)
    return (
        f"activate them as cost allocation tags (Billing console, Cost allocation tags; or `aws ce "
        f"update-cost-allocation-tags-status --cost-allocation-tags-status {listed}`): a tag can be activated only "
        "once resources carry it and it reached the billing data (up to 24 h), and Cost Explorer shows it up to 24 h "
        "after (AWS Billing user guide, 'Activating user-defined cost allocation tags')"
    )


def tag_activation(ce: Any, keys: Iterable[str] = COST_ALLOCATION_TAGS) -> tuple[dict[str, str], int]:
    """Each tag key's cost-allocation status from ListCostAllocationTags (Cost Explorer API
    reference): "Active", "Inactive", or "not seen" for a key the billing data does not hold yet
    (it is then not listed at all); and the requests made (each one priced as CE_REQUEST_USD).
    A refusal (AccessDenied, an endpoint without the call) raises SourceUnavailable naming it."""
    wanted = list(keys)
    status = dict.fromkeys(wanted, "not seen")
    requests = 0
    token = None
    try:
        while True:
            kw: dict[str, Any] = {"TagKeys": wanted, "Type": "UserDefined"}
            if token:
                kw["NextToken"] = token
            resp = ce.list_cost_allocation_tags(**kw)
            requests += 1
            for tag in resp.get("CostAllocationTags", []):
                if tag.get("TagKey") in status:
                    status[tag["TagKey"]] = str(tag.get("Status", "not seen"))
            token = resp.get("NextToken")
            if not token:
                break
    except Exception as exc:  # botocore: AccessDenied, UnknownOperation, endpoint errors
        raise SourceUnavailable(f"Cost Explorer ListCostAllocationTags: {type(exc).__name__}: {exc}") from None
    return status, requests


@dataclass
class FleetBill:
    effective_usd: float = 0.0
    billed_usd: float = 0.0
    rows: int = 0
    commitment_rows: int = 0  # rows covered by a Savings Plan / RI (CommitmentDiscountId set)
    resources: int = 0

    def as_dict(self) -> dict[str, object]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class CostExplorerBill:
    """Cost Explorer's answer for a window: per fleet tag, and the period it actually covers."""

    by_fleet: dict[str, float]  # empty: Cost Explorer returned no rows (`no_rows` says why that is no figure)
    granularity: str  # HOURLY or DAILY
    start: str  # as sent: inclusive
    end: str  # as sent: exclusive
    note: str  # why this granularity (the HOURLY refusal, or the window's age)
    campaign: str = ""
    requests: int = 0  # GetCostAndUsage requests sent for it, the refused HOURLY one included
    estimated: bool = False  # a period of the answer is marked Estimated (its month's bill is not final)

    @property
    def usd(self) -> float | None:
        """The bill over the period; None when Cost Explorer returned no rows (`no_rows` says why)."""
        return sum(self.by_fleet.values()) if self.by_fleet else None

    @property
    def no_rows(self) -> str:
        """What an answer with no rows means for this period (NO_ROWS)."""
        return NO_ROWS.format(campaign=self.campaign, start=self.start, end=self.end, granularity=self.granularity)


@dataclass
class _Pages:
    """What the GetCostAndUsage pages of one question said, and how many requests they took."""

    by_fleet: dict[str, float]
    requests: int = 0
    estimated: bool = False


def cost_explorer_by_fleet(
    ce: Any, campaign: str, start: str, end: str, granularity: str = "DAILY"
) -> dict[str, float]:
    """Unblended cost per `fleet` tag value for resources tagged campaign=<campaign>, from
    `start` (inclusive) to `end` (exclusive): dates for DAILY, yyyy-MM-ddThh:mm:ssZ for HOURLY."""
    return _cost_pages(ce, campaign, start, end, granularity, _Pages({})).by_fleet


def _cost_pages(ce: Any, campaign: str, start: str, end: str, granularity: str, pages: _Pages) -> _Pages:
    """cost_explorer_by_fleet's pages into `pages`, each request counted (a refused one too) and
    an `Estimated` period noted (GetCostAndUsage's ResultByTime.Estimated)."""
    out = pages.by_fleet
    token = None
    try:
        while True:
            kw: dict[str, Any] = {
                "TimePeriod": {"Start": start, "End": end},
                "Granularity": granularity,
                "Metrics": ["UnblendedCost"],
                "Filter": {"Tags": {"Key": "campaign", "Values": [campaign], "MatchOptions": ["EQUALS"]}},
                "GroupBy": [{"Type": "TAG", "Key": "fleet"}],
            }
            if token:
                kw["NextPageToken"] = token
            pages.requests += 1
            resp = ce.get_cost_and_usage(**kw)
            for period in resp.get("ResultsByTime", []):
                pages.estimated = pages.estimated or bool(period.get("Estimated"))
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
    return pages


def _utc(unix: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(unix, dt.UTC)


def _hour_floor(t: dt.datetime) -> dt.datetime:
    return t.replace(minute=0, second=0, microsecond=0)


def hourly_period(start_unix: float, end_unix: float) -> tuple[str, str]:
    """The whole UTC hours that hold [start, end], as HOURLY's TimePeriod takes them."""
    s, end = _hour_floor(_utc(start_unix)), _utc(end_unix)
    e = _hour_floor(end)
    if e < end or e <= s:
        e += dt.timedelta(hours=1)
    return s.strftime("%Y-%m-%dT%H:%M:%SZ"), e.strftime("%Y-%m-%dT%H:%M:%SZ")


def daily_period(start_unix: float, end_unix: float) -> tuple[str, str]:
    """The whole UTC days that hold [start, end], as DAILY's TimePeriod takes them."""
    return _utc(start_unix).date().isoformat(), (_utc(end_unix).date() + dt.timedelta(days=1)).isoformat()


def cost_explorer_window(
    ce: Any, campaign: str, start_unix: float, end_unix: float, now_unix: float
) -> CostExplorerBill:
    """The campaign's cost over the whole UTC hours that hold the run's window (HOURLY), or, where
    the account has no hourly data or the window is older than 14 days, the whole UTC days (DAILY).
    Raises CostExplorerRefused (a SourceUnavailable) with the requests it made when no answer came."""
    sent = 0
    if _utc(now_unix) - _utc(start_unix) > HOURLY_LOOKBACK:
        note = "DAILY: the window began more than 14 days ago, past HOURLY's reach"
    else:
        s, e = hourly_period(start_unix, end_unix)
        pages = _Pages({})
        try:
            _cost_pages(ce, campaign, s, e, "HOURLY", pages)
            return CostExplorerBill(
                pages.by_fleet,
                "HOURLY",
                s,
                e,
                "HOURLY: the window's whole UTC hours",
                campaign,
                pages.requests,
                pages.estimated,
            )
        except SourceUnavailable as exc:
            sent = pages.requests
            note = f"DAILY: HOURLY refused ({exc}; it needs hourly granularity enabled in Cost Explorer's settings)"
    s, e = daily_period(start_unix, end_unix)
    pages = _Pages({}, sent)
    try:
        _cost_pages(ce, campaign, s, e, "DAILY", pages)
    except SourceUnavailable as exc:
        raise CostExplorerRefused(str(exc), pages.requests) from None
    return CostExplorerBill(pages.by_fleet, "DAILY", s, e, note, campaign, pages.requests, pages.estimated)


class CostExplorerRefused(SourceUnavailable):
    """Cost Explorer gave no answer; `requests`: the ones sent for it all the same."""

    def __init__(self, message: str, requests: int) -> None:
        super().__init__(message)
        self.requests = requests


def _num(value: str, name: str, line: int, col: str) -> float:
    try:
        return float(value) if value != "" else 0.0
    except ValueError:
        raise BadBillingData(f"{name}:{line}: {col}: not a number: {value!r}") from None


def _instant(value: str, name: str, line: int, col: str) -> float:
    """A FOCUS date-time (ISO 8601, UTC: `2026-01-01T00:00:00Z`) as Unix seconds."""
    try:
        t = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise BadBillingData(f"{name}:{line}: {col}: not an ISO 8601 date-time: {value!r}") from None
    return (t if t.tzinfo else t.replace(tzinfo=dt.UTC)).timestamp()


def _in_window(row: dict[str, str], name: str, line: int, window: tuple[float, float]) -> bool:
    """The row's charge period [ChargePeriodStart, ChargePeriodEnd) overlaps the window."""
    start = _instant(row["ChargePeriodStart"], name, line, "ChargePeriodStart")
    end = _instant(row[FOCUS_PERIOD_END], name, line, FOCUS_PERIOD_END)
    return start < window[1] and end > window[0]


class FocusSums:
    """A FOCUS export's costs per `fleet` tag, summed over one or more parts (AWS Data Exports may
    split one export over several files): rows tagged campaign=<campaign> and, with `window` in
    Unix seconds, whose charge period overlaps it. `parts`: what was read, as errors cite it."""

    def __init__(self, campaign: str, window: tuple[float, float] | None = None) -> None:
        self.campaign, self.window = campaign, window
        self.bills: dict[str, FleetBill] = {}
        self._resources: dict[str, set[str]] = {}  # across parts: a resource billed in two counts once
        self.parts: list[str] = []

    def add(self, lines: Iterable[str], name: str) -> None:
        """One part's rows; `name` is what errors cite."""
        reader = csv.DictReader(lines)
        needed = FOCUS_COLUMNS + ((FOCUS_PERIOD_END,) if self.window is not None else ())
        missing = [c for c in needed if c not in (reader.fieldnames or [])]
        if missing:
            raise BadBillingData(f"{name}: FOCUS export lacks column(s): {', '.join(missing)}")
        for line, row in enumerate(reader, start=2):
            try:
                tags = json.loads(row["Tags"]) if row["Tags"] else {}
            except ValueError:
                raise BadBillingData(f"{name}:{line}: Tags: not a JSON object: {row['Tags']!r}") from None
            if not isinstance(tags, dict) or tags.get("campaign") != self.campaign:
                continue
            if self.window is not None and not _in_window(row, name, line, self.window):
                continue
            fleet = str(tags.get("fleet", "(untagged)"))
            b = self.bills.setdefault(fleet, FleetBill())
            b.effective_usd += _num(row["EffectiveCost"], name, line, "EffectiveCost")
            b.billed_usd += _num(row["BilledCost"], name, line, "BilledCost")
            b.rows += 1
            b.commitment_rows += bool(row["CommitmentDiscountId"])
            self._resources.setdefault(fleet, set()).add(row["ResourceId"])
            b.resources = len(self._resources[fleet])
        self.parts.append(name)


def sum_focus(
    lines: Iterable[str], name: str, campaign: str, window: tuple[float, float] | None = None
) -> dict[str, FleetBill]:
    """Sum a FOCUS export's costs per `fleet` tag for rows tagged campaign=<campaign> (and, with
    `window` in Unix seconds, whose charge period overlaps it); `name` is what errors cite."""
    sums = FocusSums(campaign, window)
    sums.add(lines, name)
    return sums.bills


# A FOCUS part this reads: CSV, gzip-compressed or not (AWS Data Exports writes "csv.gz"; its
# Parquet parts are not read). Anything else under a prefix (the export's manifest files) is skipped.
FOCUS_PART_SUFFIXES = (".csv", ".csv.gz")


def split_s3_uri(uri: str) -> tuple[str, str]:
    """s3://bucket/key or s3://bucket/prefix/ -> (bucket, key or prefix), or an error naming the URI."""
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    if not uri.startswith("s3://") or not bucket or not key:
        raise BadBillingData(
            f"{uri}: expected s3://BUCKET/KEY of one FOCUS export CSV, or s3://BUCKET/PREFIX/ of its parts"
        )
    return bucket, key


def read_focus(
    source: str | Path, campaign: str, window: tuple[float, float] | None = None, *, s3: Any = None
) -> dict[str, FleetBill]:
    """A FOCUS export's sums per fleet (FocusSums), read_focus_parts' bills."""
    return read_focus_parts(source, campaign, window, s3=s3).bills


def read_focus_parts(
    source: str | Path, campaign: str, window: tuple[float, float] | None = None, *, s3: Any = None
) -> FocusSums:
    """A FOCUS export's sums per fleet from a local CSV, from s3://bucket/key (one object), or from
    every CSV part under s3://bucket/prefix/ (ListObjectsV2, every page), each streamed from
    GetObject's body without a local copy (`s3`: a boto3 S3 client; one is made when None). A name
    ending .gz is gunzipped on the way (AWS Data Exports writes FOCUS as gzip-compressed CSV)."""
    text = str(source)
    sums = FocusSums(campaign, window)
    if not text.startswith("s3://"):
        with Path(source).open("rb") as raw:
            _sum_stream(raw, text, sums)
        return sums
    bucket, key = split_s3_uri(text)
    if s3 is None:
        import boto3

        s3 = boto3.client("s3")
    keys = [key]
    if key.endswith("/"):
        try:
            pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=key)
            listed = [o["Key"] for page in pages for o in page.get("Contents", [])]
        except Exception as exc:  # botocore
            raise SourceUnavailable(f"{text}: ListObjectsV2: {type(exc).__name__}: {exc}") from None
        keys = sorted(k for k in listed if k.endswith(FOCUS_PART_SUFFIXES))
        if not keys:
            raise SourceUnavailable(
                f"{text}: no FOCUS CSV part under the prefix ({len(listed)} object(s), none ending "
                f"{' or '.join(FOCUS_PART_SUFFIXES)})"
            )
    for k in keys:
        name = f"s3://{bucket}/{k}"
        try:
            body = s3.get_object(Bucket=bucket, Key=k)["Body"]
        except Exception as exc:  # botocore
            raise SourceUnavailable(f"{name}: GetObject: {type(exc).__name__}: {exc}") from None
        with body:
            _sum_stream(body, name, sums)
    return sums


def _sum_stream(raw: IO[bytes], name: str, sums: FocusSums) -> None:
    stream: IO[bytes] = gzip.GzipFile(fileobj=raw) if name.endswith(".gz") else raw  # type: ignore[assignment]
    try:
        sums.add(io.TextIOWrapper(stream, encoding="utf-8", newline=""), name)
    except (UnicodeDecodeError, gzip.BadGzipFile, EOFError) as exc:
        raise BadBillingData(f"{name}: not a UTF-8 CSV{' (gzip)' if name.endswith('.gz') else ''}: {exc}") from None
