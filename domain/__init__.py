"""The claim model's pure rules: the law, the claim bookkeeping, the phase machine, the report history, timings.

No I/O, no clocks, no Temporal: workflows, activities, watchers and the provider all read them, and the workflow
sandbox passes them through (homelab_autoscaler/temporal.py PASSTHROUGH) so they load once per process.
"""
