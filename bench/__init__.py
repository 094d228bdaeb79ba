"""`make bench` (`python -m bench`): the performance figures of issue 14, each beside a floor measured in the same
run on the same Temporal dev server, with the operator run as people run it (`homelab-autoscaler run`)."""
