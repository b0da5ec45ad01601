# One image for web, worker, beat and agent; docker-compose.yml picks the command.
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app
COPY requirements.txt .
RUN pip install -r requirements.txt
COPY . .
RUN SECRET_KEY=build-only python manage.py collectstatic --noinput
RUN useradd --system --home /app gpucloud && mkdir -p /app/var && chown gpucloud /app/var
USER gpucloud
EXPOSE 8000
CMD ["gunicorn", "gpucloud.wsgi", "--bind", "0.0.0.0:8000", "--workers", "4", "--access-logfile", "-"]
