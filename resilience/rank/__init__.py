"""Everything that runs inside a rank process: worker, forkserver preload, startup hooks, torchrun entry.

Nothing here imports `run`, `commands` or `report`: the forkserver's preload stays small."""
