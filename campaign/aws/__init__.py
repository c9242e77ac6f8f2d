"""The AWS account's side of a campaign: the session, the stack (deploy, destroy, leftovers), its
run config and S3 trees, CDK assets, DLAMIs, the cloud checks, readiness evidence and deploy's
compile phase.
"""
