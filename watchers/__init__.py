"""The watchers: Kubernetes watches turned into workflow signals, and the one writer of the slot reports."""
