# The load generator the Fargate task runs: Locust + loadgen + campaign (manifest types).
# Pinned base so a campaign next quarter measures with the same client.
FROM python:3.11.7-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONPATH=/app \
    LOADGEN_RECORDS_DIR=/data/records \
    LOADGEN_METRICS_ADDR=0.0.0.0

WORKDIR /app
COPY loadgen/requirements-loadgen.txt /app/loadgen/requirements-loadgen.txt
RUN pip install -r /app/loadgen/requirements-loadgen.txt

COPY campaign/ /app/campaign/
COPY loadgen/ /app/loadgen/
COPY manifests/ /app/manifests/
COPY data/traces/ /app/data/traces/

RUN useradd --create-home --uid 10001 loadgen && mkdir -p /data/records && chown loadgen /data/records
USER loadgen

# 8089 Locust web UI / master; 5557 master<->worker; 9646 Prometheus (--metrics-port).
EXPOSE 8089 5557 9646
ENTRYPOINT ["locust", "-f", "/app/loadgen/locustfile.py"]
CMD ["--help"]
