"""The `kube` settings section: how a process reaches the Kubernetes API server.

A plain pydantic model, like every settings section: the command line (`homelab_autoscaler.cli`) fills it
from flags, `HOMELAB_AUTOSCALER_*` variables and the config file; each field's alias is the setting's name.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from api.addresses import check_file, check_url, field_checks


class KubeSettings(BaseModel):
    """Where the API server is: a URL, a kubeconfig (and context), or the pod's service account."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_by_name=True, validate_by_alias=True)

    server: str | None = Field(
        None,
        alias="kube_server",
        description="API server URL (the emulator, a proxy); else the pod's service account or a kubeconfig",
    )
    kubeconfig: Path | None = Field(None, description="kubeconfig file; else $KUBECONFIG, else ~/.kube/config")
    context: str | None = Field(None, alias="kube_context", description="context of the kubeconfig to use")
    timeout_seconds: float = Field(
        10.0, gt=0, le=120, alias="kube_timeout_seconds", description="timeout of one API request"
    )

    _checked = field_checks({"server": check_url, "kubeconfig": check_file})
