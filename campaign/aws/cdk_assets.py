"""The CDK assets a stack used, and whether they are still stored after teardown.

`cdk deploy` uploads the stack's assets (here: the load generator's Docker image) to the
bootstrap stack's ECR repository and S3 bucket. Deleting the stack leaves them there: they
belong to the CDK bootstrap, shared by every CDK app in the account and region, and another
stack may use the same content-addressed asset. So teardown does not delete them; it reads
the stack's own template before the stack goes, then reports which of its assets are still
stored (and what they cost to keep), and names the command that collects unused ones:
`cdk gc aws://ACCOUNT/REGION --unstable=gc` (AWS CDK v2 Developer Guide, "cdk gc",
https://docs.aws.amazon.com/cdk/v2/guide/ref-cli-cmd-gc.html).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

# An image asset as CDK's default synthesizer writes it into a template (inside an Fn::Sub).
_IMAGE = re.compile(r"(cdk-[a-z0-9]+-container-assets-\$\{AWS::AccountId\}-[a-z0-9-]+):([0-9a-f]{64})")
_BUCKET = re.compile(r"^cdk-[a-z0-9]+-assets-\$\{AWS::AccountId\}-[a-z0-9-]+$")


@dataclass(frozen=True)
class CdkAsset:
    kind: str  # "image" (ECR repository:tag) or "file" (S3 bucket/key)
    container: str  # repository or bucket, account resolved
    name: str  # image tag or object key

    def __str__(self) -> str:
        return f"ecr {self.container}:{self.name}" if self.kind == "image" else f"s3://{self.container}/{self.name}"


def _sub_text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and "Fn::Sub" in value:
        sub = value["Fn::Sub"]
        return sub if isinstance(sub, str) else None
    return None


def assets_in_template(template: Any, account: str) -> list[CdkAsset]:
    """Image assets (repository:tag strings) and file assets (S3Bucket/S3Key pairs) a template uses."""
    found: set[CdkAsset] = set()
    for repo, tag in _IMAGE.findall(json.dumps(template)):
        found.add(CdkAsset("image", repo.replace("${AWS::AccountId}", account), tag))

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            bucket, key = _sub_text(node.get("S3Bucket")), node.get("S3Key")
            if bucket and _BUCKET.match(bucket) and isinstance(key, str):
                found.add(CdkAsset("file", bucket.replace("${AWS::AccountId}", account), key))
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(template)
    return sorted(found, key=str)


def stack_assets(session: Any, stack: str) -> list[CdkAsset]:
    """The assets the deployed stack's template uses ([] when the stack does not exist)."""
    from botocore.exceptions import ClientError

    try:
        body = session.client("cloudformation").get_template(StackName=stack, TemplateStage="Original")["TemplateBody"]
    except ClientError as exc:
        if "does not exist" in str(exc):
            return []
        raise
    template = json.loads(body) if isinstance(body, str) else body
    account = session.client("sts").get_caller_identity()["Account"]
    return assets_in_template(template, account)


def still_stored(session: Any, assets: list[CdkAsset]) -> list[tuple[CdkAsset, float | None]]:
    """(asset, size in MB when known) for each asset the bootstrap still stores."""
    from botocore.exceptions import ClientError

    out: list[tuple[CdkAsset, float | None]] = []
    for a in assets:
        try:
            if a.kind == "image":
                images = session.client("ecr").describe_images(
                    repositoryName=a.container, imageIds=[{"imageTag": a.name}]
                )
                size = sum(float(i.get("imageSizeInBytes", 0)) for i in images.get("imageDetails", []))
            else:
                size = float(session.client("s3").head_object(Bucket=a.container, Key=a.name)["ContentLength"])
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code in ("ImageNotFoundException", "RepositoryNotFoundException", "404", "NoSuchKey", "NoSuchBucket"):
                continue
            out.append((a, None))  # not readable (access denied): reported, as it may be stored
            continue
        out.append((a, size / 1e6))
    return out


def gc_command(session: Any) -> str:
    account = session.client("sts").get_caller_identity()["Account"]
    return f"cdk gc aws://{account}/{session.region_name} --unstable=gc"
