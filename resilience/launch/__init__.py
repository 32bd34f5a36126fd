"""How rank processes start: the fork server, spawned interpreters, layered packages."""
