"""Faults in the path of a save's writes: a full disk, a power cut or crash that loses what was not
durable, a second save begun while one is in flight, ranks that disagree on where they save."""
