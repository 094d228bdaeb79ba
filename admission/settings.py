"""The `webhook` settings section: where the NodeClaim admission webhook listens, and its certificate.

Off unless given an address. An API server calls a webhook over HTTPS only, so an address without a certificate
and its key is refused when the setting is read, before anything starts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from api.addresses import check_file, check_host_port, field_checks


class WebhookSettings(BaseModel):
    """The validating webhook of NodeClaims (deploy/components/admission registers it with the API server)."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_by_name=True, validate_by_alias=True)

    address: str = Field(
        "",
        alias="webhook_address",
        description="host:port the NodeClaim admission webhook listens on, over HTTPS (empty: no webhook)",
    )
    tls_cert: Path | None = Field(
        None, alias="webhook_tls_cert", description="the webhook's serving certificate (PEM), re-read when it changes"
    )
    tls_key: Path | None = Field(None, alias="webhook_tls_key", description="the webhook's private key (PEM)")

    # ":9443" listens on every interface, as in a pod; "" turns the webhook off
    _checked = field_checks(
        {
            "address": lambda value: value and check_host_port(value, empty_host=True),
            "tls_cert": check_file,
            "tls_key": check_file,
        }
    )

    @model_validator(mode="after")
    def _https(self) -> Self:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("webhook_tls_cert and webhook_tls_key go together")
        if self.address and self.tls_cert is None:
            raise ValueError(
                "webhook_address needs webhook_tls_cert and webhook_tls_key: an API server calls a webhook over "
                "HTTPS only"
            )
        return self

    @property
    def enabled(self) -> bool:
        return bool(self.address)
