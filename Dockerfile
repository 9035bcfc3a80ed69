# GPU image for the KERPLE training stack.
# NOTE: this image is NOT built in CI (the CI machine has no GPU and no Docker engine); it is
# provided for cluster users. Build: docker build -t kerple-neox .
FROM nvidia/cuda:12.8.1-cudnn-devel-ubuntu22.04

ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1
RUN apt-get update && apt-get install -y --no-install-recommends \
        python3.11 python3.11-venv python3.11-dev python3-pip git build-essential pdsh numactl \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /workspace/kerple
COPY requirements.txt constraints.txt ./
RUN python3.11 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
# torch first (the CUDA build from PyPI here), then everything else pinned against it.
RUN pip install torch==2.13.0 \
 && DS_BUILD_OPS=0 pip install -c constraints.txt -r requirements.txt
COPY . .
CMD ["python", "deepy.py", "--help"]
