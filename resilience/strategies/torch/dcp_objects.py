"""The dcp strategy's object-store half: DCP's writer and reader for an ``s3://`` URL
(``FsspecWriter``/``FsspecReader`` over s3fs, or s3torchconnector's ``S3StorageWriter``/
``S3StorageReader`` over the CRT client), the committed steps listed from the store, and the
loader's checks of the options that reach them. Clients are imported only when used, in ranks."""
from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

OBJECT_STORAGES = ("fsspec", "s3torchconnector")  # the `storage` options that reach an object store
MIN_PART = 5 * 2**20  # S3 refuses smaller parts than this (but the last)
STEP_DIR = re.compile(r"^step_(\d{8})$")
METADATA = ".metadata"  # DCP's own name for the file its coordinator writes last


def committed_steps_at(url: str) -> list[int]:
    """Steps under ``url`` whose ``.metadata`` object exists, newest first (listed afresh)."""
    from fsspec.core import url_to_fs

    fs, root = url_to_fs(url)
    found = fs.glob(f"{root}/step_*/{METADATA}", refresh=True)
    steps = [int(m.group(1)) for path in found if (m := STEP_DIR.match(path.rstrip("/").split("/")[-2]))]
    return sorted(steps, reverse=True)


def s3_client_config():
    """s3torchconnector's CRT client reads its endpoint from ``AWS_ENDPOINT_URL`` (the case's
    proxy); an IP address as endpoint needs path-style requests."""
    from s3torchconnector import S3ClientConfig

    return S3ClientConfig(force_path_style=True)


def object_writer(url: str, storage: str, options: Mapping[str, Any]):
    if storage == "s3torchconnector":
        from s3torchconnector.dcp import S3StorageWriter

        return S3StorageWriter(region=os.environ["AWS_REGION"], path=url, s3client_config=s3_client_config())
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

    from ...core.sizes import parse_size

    part = options.get("part_size")  # reaches s3fs's constructor through fsspec
    return FsspecWriter(url, **({"default_block_size": parse_size(part)} if part else {}))


def object_reader(url: str, storage: str):
    if storage == "s3torchconnector":
        from s3torchconnector.dcp import S3StorageReader

        return S3StorageReader(region=os.environ["AWS_REGION"], path=url, s3client_config=s3_client_config())
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

    return FsspecReader(url)


def part_size_problem(options: Mapping[str, Any]) -> tuple[str, str, Any, Any] | None:
    """``part_size``: the s3fs block size, above which an object goes up as a multipart upload."""
    from ...core.sizes import parse_size

    if "part_size" in options and (parse_size(options["part_size"]) or 0) < MIN_PART:
        return ("strategy.options.part_size", "must be a size of at least 5 MiB (S3's smallest part)",
                options["part_size"], "a size such as 5MiB")
    return None


def object_storage_problem(options: Mapping[str, Any], store: str | None) -> tuple[str, str, Any, Any] | None:
    storage = options.get("storage", "filesystem")
    if store is None:
        if storage == "s3torchconnector":
            return ("strategy.options.storage", "s3torchconnector writes to an object store only", storage,
                    "filesystem or fsspec, or object_store: s3 beside it")
        return None
    if storage not in OBJECT_STORAGES:
        return ("strategy.options.storage", f"object_store: {store} is reached through fsspec or s3torchconnector",
                storage, ", ".join(OBJECT_STORAGES))
    return None


def missing_client(options: Mapping[str, Any]) -> str | None:
    import importlib.util

    if options.get("storage") == "s3torchconnector" and importlib.util.find_spec("s3torchconnector") is None:
        return "s3torchconnector is not installed (pip install -e '.[s3]')"
    return None
