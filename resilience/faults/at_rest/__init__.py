"""Faults on checkpoints at rest, between the save and the restore: damaged, missing, duplicated or
hostile files, a stale pointer, a restamped version, a straggler's late writes, storage that refuses
or slows the restore's reads. ``damage.py`` holds the family's base class."""
