# One image for every AstraFlow component (streams, workers, trainer, feeder, topic-init).
# CPU-only torch from the PyTorch index keeps it small; GPU hosts build with TORCH_INDEX set to a
# CUDA index (or install the `sglang` extra on the inference hosts).
FROM python:3.11-slim

ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1

# bubblewrap isolates the code environment's sandbox. It needs namespaces, which Docker's default
# seccomp and AppArmor profiles refuse: run worker containers with
#   --security-opt seccomp=unconfined --security-opt apparmor=unconfined
# (no added capability; the host must allow unprivileged user namespaces; not yet tried in Docker).
# Without them the sandbox still runs, unisolated, with a loud warning and isolation="none" on every
# result.
RUN apt-get update && apt-get install -y --no-install-recommends bubblewrap && rm -rf /var/lib/apt/lists/*

WORKDIR /app
COPY pyproject.toml constraints.txt README.md topics.yaml ./
COPY astraflow ./astraflow
COPY workers ./workers
COPY streams ./streams
COPY trainer ./trainer
COPY recipes ./recipes
RUN pip install --extra-index-url "$TORCH_INDEX" -c constraints.txt . \
    && useradd --create-home --uid 10001 astraflow \
    && mkdir -p /app/runs && chown astraflow /app/runs
USER astraflow
# topics.yaml is read from the working directory's copy.
ENV ASTRAFLOW_TOPICS_FILE=/app/topics.yaml
CMD ["astraflow", "--help"]
