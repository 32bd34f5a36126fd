"""Object storage as a checkpoint target: a real S3-compatible server on loopback (`server`), the
fault proxy between it and the ranks (`proxy`), and what a rank's S3 clients are given (`client`)."""
