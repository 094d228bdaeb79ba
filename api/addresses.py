"""What a setting of any layer accepts as an address or a Kubernetes name, checked when the setting is read.

A value these refuse would fail later, inside a library, after servers were started (`--metrics-address bogus`
stopped `dev` with a Rust traceback once Temporal and the simulator were up): each check raises `ValueError`
with one line saying what is wrong, which the command line prints naming the setting.
"""

from __future__ import annotations

import ipaddress
import re
import urllib.parse
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationInfo, field_validator

__all__ = [
    "check_connect_address",
    "check_dns_label",
    "check_dns_subdomain",
    "check_file",
    "check_host",
    "check_host_port",
    "check_ip",
    "check_label_key",
    "check_label_value",
    "check_new_file",
    "check_token",
    "check_url",
    "each",
    "field_checks",
]

Check = Callable[[Any], object]

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_HOST_LABEL = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_]*[A-Za-z0-9])?")
_LABEL_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")


def check_ip(value: str) -> str:
    """An IPv4 or IPv6 address (what a server that takes no host name binds)."""
    try:
        ipaddress.ip_address(value)
    except ValueError:
        raise ValueError(f"{value!r} is not an IP address") from None
    return value


def check_host(value: str) -> str:
    """A host name or an IP address."""
    try:
        ipaddress.ip_address(value)
        return value
    except ValueError:
        pass
    labels = value.rstrip(".").split(".")
    if not value or len(value) > 253 or not all(len(x) <= 63 and _HOST_LABEL.fullmatch(x) for x in labels):
        raise ValueError(f"{value!r} is not a host name or an IP address")
    return value


def check_host_port(value: str, *, ip_only: bool = False, empty_host: bool = False) -> tuple[str, int]:
    """`host:port` or `[IPv6]:port` as (host, port). `ip_only`: the host must be an IP address (a bind address
    that takes no name); `empty_host`: `:port` means every interface."""
    if value.startswith("["):
        end = value.find("]")
        if end < 0 or value[end + 1 : end + 2] != ":":
            raise ValueError(f"{value!r} is not [IPv6]:port")
        host, port = value[1:end], value[end + 2 :]
        check_ip(host)
    else:
        host, sep, port = value.rpartition(":")
        if not sep:
            raise ValueError(f"{value!r} is not host:port")
        if ":" in host:
            raise ValueError(f"{value!r}: an IPv6 address goes in brackets, [{host}]:{port}")
        if ip_only and (host or not empty_host):
            check_ip(host)
        elif host or not empty_host:
            check_host(host)
    if not port.isdigit() or int(port) > 65535:
        raise ValueError(f"{value!r}: the port {port!r} is not a number from 0 to 65535")
    return host, int(port)


def check_connect_address(value: str) -> str:
    """`host:port` of a server to connect to: a host, and a port that is not 0."""
    _, port = check_host_port(value)
    if port == 0:
        raise ValueError(f"{value!r}: port 0 is no port to connect to")
    return value


def check_url(value: str) -> str:
    """An http(s) URL with a host (an API server)."""
    parsed = urllib.parse.urlsplit(value)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ValueError(f"{value!r} is not an http:// or https:// URL with a host")
    try:
        parsed.port  # noqa: B018  (parsing it is the check)
    except ValueError:
        raise ValueError(f"{value!r}: the port is not a number from 0 to 65535") from None
    check_host(parsed.hostname)
    return value


def check_dns_label(value: str) -> str:
    """A DNS-1123 label (a namespace name): lower-case alphanumerics and '-', 63 at most."""
    if len(value) > 63 or not _DNS_LABEL.fullmatch(value):
        raise ValueError(f"{value!r} is not a DNS-1123 label (lower-case letters, digits and '-', 63 at most)")
    return value


def check_dns_subdomain(value: str) -> str:
    """A DNS-1123 subdomain (most object names): DNS labels joined by '.', 253 at most."""
    if len(value) > 253 or not all(_DNS_LABEL.fullmatch(part) for part in value.split(".")):
        raise ValueError(f"{value!r} is not a DNS-1123 subdomain (lower-case letters, digits, '-' and '.')")
    return value


def check_label_value(value: str) -> str:
    """A label value: empty, or 63 at most of letters, digits, '-', '_' and '.', alphanumeric at both ends."""
    if value and (len(value) > 63 or not _LABEL_NAME.fullmatch(value)):
        raise ValueError(f"{value!r} is not a label value (letters, digits, '-', '_', '.'; 63 at most)")
    return value


def check_label_key(value: str) -> str:
    """A label key: an optional DNS-subdomain prefix and '/', then a name as a label value (not empty)."""
    prefix, _, name = value.rpartition("/")
    if prefix:
        check_dns_subdomain(prefix)
    if not name:
        raise ValueError(f"{value!r} is not a label key: its name is empty")
    check_label_value(name)
    return value


def check_file(path: Path) -> Path:
    """A file that exists (a certificate, a key, a kubeconfig): a directory or nothing is refused now, not when
    the file is first opened."""
    if not path.is_file():
        raise ValueError(f"{path} is not a readable file")
    return path


def check_new_file(path: Path) -> Path:
    """A file that may not exist yet (a database): not a directory, in a directory that exists."""
    if path.is_dir() or not path.parent.is_dir():
        raise ValueError(f"{path}: a file in a directory that exists")
    return path


def check_token(value: str) -> str:
    """A secret token (an API key): one word of printable characters, so a stray newline from a file is caught."""
    if not value or any(ch.isspace() or not ch.isprintable() for ch in value):
        raise ValueError("a token is one word of printable characters (a stray newline from a file?)")
    return value


def each(check: Check) -> Check:
    """The check of a list setting: every item through `check`."""

    def check_all(values: list[Any]) -> list[Any]:
        for value in values:
            check(value)
        return values

    return check_all


def field_checks(checks: Mapping[str, Check]) -> Any:
    """One pydantic validator for a settings model: each named field's value (unless None) through its check,
    which raises `ValueError` saying what is wrong. Assign it in the class body: `_checked = field_checks({...})`."""

    def validate(cls: type, value: Any, info: ValidationInfo) -> Any:
        if value is not None:
            checks[str(info.field_name)](value)
        return value

    return field_validator(*checks)(validate)
