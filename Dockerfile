# The lite-verl training image: what `lite-verl k8s --image IMG` runs.
#
#   docker build -t registry.example.com/lite-verl:0.1 .
#   docker push registry.example.com/lite-verl:0.1
#   lite-verl k8s RUN_DIR --image registry.example.com/lite-verl:0.1 | kubectl apply -f -
#
# CUDA comes with the PyPI wheels of torch and vLLM (their own CUDA runtime libraries), so a slim Python
# base is enough; the node needs the NVIDIA driver and, on Kubernetes, the NVIDIA device plugin.
# Extras: vllm (rollout), awq (AutoAWQ calibration), qlora (bitsandbytes). For DeepSpeed add it to the
# list. Models and data are not baked in: the Job mounts them at /models and /data.
FROM python:3.12-slim

# Triton (vLLM, torch.compile) compiles small C launchers at run time: it needs a C compiler.
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc g++ git \
    && rm -rf /var/lib/apt/lists/*

ENV PIP_NO_CACHE_DIR=1 \
    PYTHONUNBUFFERED=1 \
    HF_HUB_OFFLINE=1 \
    LITE_VERL_CACHE=/runs/.cache/lite-verl

WORKDIR /opt/lite-verl
COPY pyproject.toml README.md ./
COPY lite_verl ./lite_verl
COPY presets ./presets
RUN pip install ".[vllm,awq,qlora]" && lite-verl --version

ENTRYPOINT ["lite-verl"]
CMD ["--help"]
