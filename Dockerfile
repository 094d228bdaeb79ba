# syntax=docker/dockerfile:1
# One image for every role of the operator: `docker run IMAGE run|worker|provider|watch|certs ...`, for linux/amd64
# and linux/arm64 from this one file (docs/install.md, "Building and publishing the image"). It holds what a Pod runs:
# no installer and no Temporal dev server (`homelab-autoscaler dev` is for a person's machine, with the `dev` extra;
# deploy/overlays/dev-server runs the dev server from Temporal's admin-tools image).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# The dependencies alone, read from pyproject.toml: the layer that installs them is rebuilt only when they change,
# not when the code or another line of pyproject.toml does.
FROM ${PYTHON_IMAGE} AS requirements
WORKDIR /src
COPY pyproject.toml ./
RUN python -c 'import tomllib; project = tomllib.load(open("pyproject.toml", "rb"))["project"]; \
print("\n".join(project["dependencies"]))' > requirements.txt

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# binutils' strip, for the slimming step at the end of this stage (the image itself has no binutils).
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends binutils \
 && rm -rf /var/lib/apt/lists/*
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
# Dependencies first, so a source change does not reinstall them.
COPY --from=requirements /src/requirements.txt /tmp/requirements.txt
RUN pip install -r /tmp/requirements.txt
COPY pyproject.toml README.md ./
COPY api/ api/
COPY workflows/ workflows/
COPY activities/ activities/
COPY watchers/ watchers/
COPY provider/ provider/
COPY admission/ admission/
COPY proto/ proto/
COPY kube/ kube/
COPY domain/ domain/
COPY homelab_autoscaler/ homelab_autoscaler/
RUN pip install --no-deps . && pip check && homelab-autoscaler --help >/dev/null
# What no Pod runs out (pip, setuptools, the Kubernetes client's asyncio twin, sources and tests wheels carry), the
# pure-Python dependencies packed into one zip, extension modules stripped; then every module of the project is
# imported from what is left (tools/slim_venv.py says what and how much).
COPY tools/slim_venv.py /tmp/slim_venv.py
RUN python /tmp/slim_venv.py /opt/venv --strip --skip proto.generate \
      --check api domain workflows activities kube watchers provider admission homelab_autoscaler proto \
 && homelab-autoscaler --version

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="homelab-autoscaler" \
      org.opencontainers.image.description="Powers homelab machines on and off for cluster-autoscaler" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/home/nonroot \
    XDG_STATE_HOME=/data
COPY --from=build /opt/venv /opt/venv
# A fixed numeric user, so `runAsNonRoot` can verify it without a passwd lookup. --no-log-init: useradd would
# otherwise grow /var/log/lastlog to a 19 MB sparse file for a uid this high, and a layer stores it whole.
RUN groupadd --gid 65532 nonroot \
 && useradd --uid 65532 --gid 65532 --home-dir /home/nonroot --create-home --no-log-init --shell /usr/sbin/nologin nonroot \
 && mkdir -p /data && chown 65532:65532 /data
USER 65532:65532
WORKDIR /home/nonroot
# 8086 externalgrpc provider, 9443 the NodeClaim admission webhook, 8081 /healthz /readyz, 9464 /metrics.
EXPOSE 8086 9443 8081 9464
ENTRYPOINT ["homelab-autoscaler"]
CMD ["run"]
