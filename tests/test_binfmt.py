"""arm64 emulation for the builds and the real node (tests/binfmt.py): the line registered from Debian's
qemu-user-static configuration, and a configuration that is not one refused by name."""

from __future__ import annotations

import pytest

from tests import binfmt

DEBIAN_CONF = (
    ":qemu-aarch64:M::\\x7f\\x45\\x4c\\x46\\x02\\x01\\x01\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x02\\x00\\xb7\\x00"
    ":\\xff\\xff\\xff\\xff\\xff\\xff\\xff\\x00\\xff\\xff\\xff\\xff\\xff\\xff\\xff\\xff\\xfe\\xff\\xff\\xff"
    ":/usr/libexec/qemu-binfmt/aarch64-binfmt-P:OPF\n"
)


def test_the_registration_keeps_the_magic_and_takes_the_static_interpreter_with_flags_for_containers() -> None:
    line = binfmt.registration("# a comment\n" + DEBIAN_CONF)
    fields = line.split(":")
    assert fields[1] == "qemu-aarch64" and fields[2] == "M"
    assert fields[4].startswith("\\x7f\\x45\\x4c\\x46") and fields[5].startswith("\\xff")
    # F: the interpreter opened at registration, so a container's root filesystem needs no copy of it.
    assert fields[6] == "/usr/bin/qemu-aarch64-static" and fields[7] == "OCF"


@pytest.mark.parametrize("conf", ["", "qemu-aarch64 is not a line", ":qemu-aarch64:E::aarch64::/usr/bin/x:F"])
def test_a_configuration_that_is_no_magic_entry_is_refused_by_name(conf: str) -> None:
    with pytest.raises(ValueError, match=r"qemu-aarch64\.conf"):
        binfmt.registration(conf)
