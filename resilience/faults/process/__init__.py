"""Faults that end or freeze a rank's processes: SIGKILL (one rank or a whole node), SIGSTOP, SIGTERM
with a grace period, a rank stuck holding the GIL."""
