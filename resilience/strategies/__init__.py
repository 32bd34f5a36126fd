"""Checkpoint systems under test. See `base.CheckpointStrategy` for the plug-in contract."""
