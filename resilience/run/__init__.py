"""Case -> phases -> CaseResult: the harness, the rank-group supervisor, the reference cache, crash
exploration, and the torchrun, black-box and checkpoint-verify drivers."""
