"""Faults between processes: a partition or a throttled link (ranks in network namespaces), a failed
collective, an object store's requests refused or delayed."""
