# vlm-gateway image: the gateway (and the simulator, `vlm-gateway sim`) on Python 3.11, with
# images and video (PyAV is a core dependency) and backend discovery (dns, kubernetes).
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app

COPY pyproject.toml README.md ./
COPY vlm_gateway ./vlm_gateway
RUN pip install '.[dns,kubernetes]' && useradd --system --uid 10001 gateway

USER gateway
EXPOSE 8080
# Listen on all interfaces inside the container; configure with VLM_GATEWAY_* variables
# or a mounted YAML file (VLM_GATEWAY_CONFIG=/path/to/gateway.yaml).
ENTRYPOINT ["vlm-gateway"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8080"]
