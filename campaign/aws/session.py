"""The boto3 session every AWS step of a campaign uses, in the manifest's region."""

from __future__ import annotations

from typing import Any


def aws_session(region: str) -> Any:
    import boto3

    return boto3.session.Session(region_name=region)
