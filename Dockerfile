# One image for web, worker, beat and agent; docker-compose.yml picks the command.
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app
COPY requirements.txt .
RUN pip install -r requirements.txt
COPY . .
RUN SECRET_KEY=build-only python manage.py collectstatic --noinput
RUN useradd --system --home /app gpucloud && mkdir -p /app/var/gateway && chown -R gpucloud /app/var
USER gpucloud
EXPOSE 8000
# Threaded workers: a heartbeat on the fast path waits on Redis, not the CPU (docs/benchmarks.md).
# The workers' alive-file lives in shared memory; touching one on disk cost 0.5 ms per request.
# Each worker's threads share a pool of at most as many PostgreSQL connections (DB_POOL_SIZE):
# a parked long poll gives its connection back instead of closing it.
CMD ["gunicorn", "gpucloud.wsgi", "--bind", "0.0.0.0:8000", "--workers", "4", "--worker-class", "gthread", \
     "--threads", "4", "--env", "DB_POOL_SIZE=4", "--worker-tmp-dir", "/dev/shm", "--access-logfile", "-"]
