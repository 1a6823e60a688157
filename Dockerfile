# syntax=docker/dockerfile:1
# One image for every crashsafe service: `crashsafe serve <service>` picks the process (infra/k8s/ sets `args`).
# Build: docker build -t crashsafe:dev .   (never in CI: the manifests are validated without a cluster or an image)

# Stage 1: the project and every dependency as wheels (a compiler, if some wheel needs one, stays here).
FROM python:3.11-slim AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY contracts ./contracts
COPY services ./services
COPY crashsafe ./crashsafe
COPY sandbox ./sandbox
COPY evals ./evals
COPY examples ./examples
# `otel`: the OpenTelemetry SDK and OTLP exporter, so the standard OTEL_* variables turn export on. No `dev`.
RUN pip wheel --wheel-dir /wheels ".[otel]"

# Stage 2: a slim interpreter with the wheels installed from the local directory only, run as a non-root user.
FROM python:3.11-slim
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 \
    PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 \
    CRASHSAFE_DATA_DIR=/var/lib/crashsafe
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-index --find-links /wheels "crashsafe[otel]" \
    && groupadd --system --gid 10001 crashsafe \
    && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/crashsafe --no-create-home crashsafe \
    && install -d -o 10001 -g 10001 -m 0700 /var/lib/crashsafe
# A numeric user, so Kubernetes' runAsNonRoot can verify it without reading /etc/passwd.
USER 10001:10001
WORKDIR /var/lib/crashsafe
# The gateway's port and every other service's ops port (/healthz, /readyz, /metrics).
EXPOSE 8080 9464
ENTRYPOINT ["crashsafe"]
CMD ["serve", "gateway"]
