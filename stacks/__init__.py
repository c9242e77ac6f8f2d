"""CDK constructs that build one comparison environment from a frozen manifest.

Nothing here imports `loadgen` or Locust: gevent's monkey-patching and jsii's node child
process deadlock when they share one Python process.
"""
