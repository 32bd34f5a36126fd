"""Measurements of the machine a qualification runs on: environment, filesystem bandwidth, throughput."""
