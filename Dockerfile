# One image for every llamarl role; the role is chosen by the container's command.
FROM python:3.11-slim
WORKDIR /app
# torch is pinned first so the package's range resolves to it; for a CPU-only image point pip at
# PyTorch's CPU wheel index here, and for GPUs start from a CUDA base image.
RUN pip install --no-cache-dir torch==2.13.0
COPY pyproject.toml README.md ./
COPY llamarl ./llamarl
COPY brokers ./brokers
COPY workers ./workers
COPY configs ./configs
RUN pip install --no-cache-dir .
ENTRYPOINT ["llamarl", "--log-format", "json"]
