"""The power methods against real protocol implementations (issue 31): a machine room of network namespaces with
real BMCs (tests/machineroom/room.py), the examples' images built from Debian packages (images.sh), and the
examples' containers run in that room (podrun.py); `make e2e-power` runs it."""
