# syntax=docker/dockerfile:1
# One image for every role of the operator: `docker run IMAGE run|worker|provider|watch|certs ...`, for linux/amd64
# and linux/arm64 from this one file (docs/install.md, "Building and publishing the image"). It holds what a Pod runs:
# no installer and no Temporal dev server (`homelab-autoscaler dev` is for a person's machine, with the `dev` extra;
# deploy/overlays/dev-server runs the dev server from Temporal's admin-tools image).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm
# What the build stages run on: the same image, for the builder's own platform (an index such as the official one
# has both). A base of one platform only names the builder's here.
ARG BUILD_PYTHON_IMAGE=${PYTHON_IMAGE}

# The dependencies alone, read from pyproject.toml: the layer that installs them is rebuilt only when they change,
# not when the code or another line of pyproject.toml does.
FROM --platform=$BUILDPLATFORM ${BUILD_PYTHON_IMAGE} AS requirements
WORKDIR /src
COPY pyproject.toml ./
RUN python -c 'import tomllib; project = tomllib.load(open("pyproject.toml", "rb"))["project"]; \
print("\n".join(project["dependencies"]))' > requirements.txt

# The virtualenv is made on the builder's platform for the target's: pip takes the target's wheels (every
# dependency publishes them for amd64 and arm64) and binutils strips the target's extension modules, so another
# platform's image needs no emulation here; the last stage imports what was made, on the target's platform.
FROM --platform=$BUILDPLATFORM ${BUILD_PYTHON_IMAGE} AS build
ARG TARGETARCH
ARG BUILDPLATFORM
ARG TARGETPLATFORM
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# The target's GNU triplet: its wheels' platform tags and its binutils (strip, for the slimming step).
RUN case "$TARGETARCH" in amd64) echo x86_64 ;; arm64) echo aarch64 ;; \
      *) echo "no wheels' platform for TARGETARCH=$TARGETARCH" >&2; exit 1 ;; esac > /tmp/machine \
 && apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      "binutils-$(sed s/_/-/ /tmp/machine)-linux-gnu" \
 && rm -rf /var/lib/apt/lists/*
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
# Dependencies first, so a source change does not reinstall them.
COPY --from=requirements /src/requirements.txt /tmp/requirements.txt
# (--target puts the dependencies' console scripts in site-packages/bin: no Pod runs them.)
RUN m=$(cat /tmp/machine) site=$(python -c 'import sysconfig; print(sysconfig.get_path("purelib"))') \
 && pip install --target "$site" \
      --only-binary=:all: --implementation cp --python-version "$(python -c 'import sys; print(sys.version[:4])')" \
      --platform "manylinux_2_36_$m" --platform "manylinux_2_28_$m" --platform "manylinux_2_17_$m" \
      --platform "manylinux2014_$m" -r /tmp/requirements.txt \
 && rm -rf "$site/bin"
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
# `pip check` also refuses wheels of another platform than its own, so it runs where the two are one (the amd64
# image on amd64); the other platform's set is the same resolution of the same requirements.
RUN pip install --no-deps . \
 && if [ "$BUILDPLATFORM" = "$TARGETPLATFORM" ]; then pip check; fi
# What no Pod runs out (pip, setuptools, the Kubernetes client's asyncio twin, sources and tests wheels carry), the
# pure-Python dependencies packed into one zip, extension modules stripped (tools/slim_venv.py says what and how
# much); the import of every module is the last stage's.
COPY tools/slim_venv.py /tmp/slim_venv.py
RUN python /tmp/slim_venv.py /opt/venv --strip --strip-program "$(cat /tmp/machine)-linux-gnu-strip" --slim-only

FROM --platform=$TARGETPLATFORM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="homelab-autoscaler" \
      org.opencontainers.image.description="Powers homelab machines on and off for cluster-autoscaler" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/home/nonroot \
    XDG_STATE_HOME=/data
COPY --from=build /opt/venv /opt/venv
# Every module of the project imported from what the build left, on this platform (under emulation for another
# than the builder's), with the slimming tool mounted from the build stage for this step only.
RUN --mount=type=bind,from=build,source=/tmp/slim_venv.py,target=/tmp/slim_venv.py \
    python /tmp/slim_venv.py /opt/venv --import-only --skip proto.generate \
      --check api domain workflows activities kube watchers provider admission homelab_autoscaler proto \
 && homelab-autoscaler --version
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
