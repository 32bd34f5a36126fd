"""What a rank's files go through: write and read interception, IO traces, the crash-state model."""
