"""Every command-line command and the pytest plugin: the top layer."""
