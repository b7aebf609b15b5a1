# One image for every llamarl role; the role is chosen by the container's command.
# torch comes from PyTorch's CPU wheel index by default, so a CPU image never pulls the multi-GB
# CUDA build; for GPUs build with --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu126
# (or another CUDA index). torch is installed first so the package's range resolves to it.
FROM python:3.11-slim
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
WORKDIR /app
RUN pip install --no-cache-dir --index-url "$TORCH_INDEX" torch==2.13.0
COPY pyproject.toml README.md ./
COPY llamarl ./llamarl
COPY brokers ./brokers
COPY workers ./workers
COPY configs ./configs
RUN pip install --no-cache-dir .
ENTRYPOINT ["llamarl", "--log-format", "json"]
