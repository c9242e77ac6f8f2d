"""Load generator: the streaming client, the open-loop Locust
replayer of core's schedule, the per-request record sink and the Prometheus exporter.

Only `loadgen.replay`, `loadgen.client` and `loadgen.locustfile` import gevent/locust; every
other module is plain Python so the analysis and unit tests never pull gevent in.
"""
