"""Faults (nemeses). See `base.Fault` for the plug-in contract."""
