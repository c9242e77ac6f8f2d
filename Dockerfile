# The load generator the Fargate tasks run: Locust + loadgen + core (the manifest types it reads).
# Pinned base so a campaign next quarter measures with the same client.
FROM python:3.11.7-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONPATH=/app \
    HARNESS_WORK_DIR=/data \
    LOADGEN_RECORDS_DIR=/data/records \
    LOADGEN_METRICS_ADDR=0.0.0.0

WORKDIR /app
COPY loadgen/requirements-loadgen.txt /app/loadgen/requirements-loadgen.txt
RUN pip install -r /app/loadgen/requirements-loadgen.txt

# No manifest and no trace in the image: each run's inputs are downloaded from the results
# bucket by loadgen/task_entry.py (uploaded there by `python -m campaign run`).
COPY core/ /app/core/
COPY loadgen/ /app/loadgen/

RUN useradd --create-home --uid 10001 loadgen && mkdir -p /data/records && chown -R loadgen /data
USER loadgen

# 8089 Locust web UI (loopback only, reached by port forwarding); 5557 master<->worker; 9646 Prometheus.
EXPOSE 5557 9646
ENTRYPOINT ["python", "-m", "loadgen.task_entry"]
CMD ["--help"]
