"""Simulation support: an in-process Kubernetes API emulator (``emulator``) for tests and the simulator.

The emulator speaks real HTTP so the operator's own ``kubernetes`` client (and ``kubectl``) exercise the
same code paths as against a cluster; see ``homelab_sim.emulator`` for what it does and does not
model.
"""
