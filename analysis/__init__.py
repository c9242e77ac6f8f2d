"""Turns a campaign's records, metrics, prices and bills into a Go / Defer / Reject report.

Flow: sources (records, Prometheus, CloudWatch, prices, billing) -> goodput -> sizing ->
cost -> ledger -> decision -> sensitivity -> report files. Never imports stacks or loadgen.
"""
