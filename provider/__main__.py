"""`python -m provider`: the provider alone; the same flags and settings as `homelab-autoscaler provider`."""

from __future__ import annotations

import sys

from homelab_autoscaler.cli import main

if __name__ == "__main__":
    sys.exit(main(["provider", *sys.argv[1:]]))
