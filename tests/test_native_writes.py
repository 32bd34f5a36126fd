"""Files written past Python's file objects, made visible: safetensors' Rust ``save_file`` (what
Accelerate writes ``model.safetensors`` with), and the IO trace's names for files staged in
``$TMPDIR`` and for descriptor-relative unlinks (``shutil.rmtree``)."""
from __future__ import annotations

import os
import shutil

import pytest
import torch

from resilience.disk.interception import Interceptor
from resilience.disk.io_trace import NamespaceHooks

safetensors_torch = pytest.importorskip("safetensors.torch", reason="pip install 'resilience[accelerate]'")


class Recorder:
    def __init__(self):
        self.calls: list[tuple] = []

    def on_open(self, file):
        self.calls.append(("open", file.relative))

    def on_write(self, file, data, nbytes):
        self.calls.append(("write", file.relative, nbytes))

    def on_fsync(self, file):
        pass

    def before_close(self, file):
        pass

    def after_close(self, file):
        self.calls.append(("close", file.relative))


def test_save_file_under_the_root_goes_through_the_listeners_with_the_librarys_bytes(tmp_path):
    tensors = {"weight": torch.randn(64, 33), "step": torch.arange(7)}
    expected = tmp_path / "expected.safetensors"
    safetensors_torch.save_file(tensors, str(expected), metadata={"format": "pt"})
    root = tmp_path / "ckpt"
    root.mkdir()
    recorder = Recorder()
    interceptor = Interceptor(root, [recorder])
    real = safetensors_torch.save_file
    interceptor.install()
    try:
        safetensors_torch.save_file(tensors, str(root / "model.safetensors"), metadata={"format": "pt"})
        safetensors_torch.save_file(tensors, str(tmp_path / "outside.safetensors"))  # not under the root
    finally:
        interceptor.uninstall()
    assert safetensors_torch.save_file is real
    assert (root / "model.safetensors").read_bytes() == expected.read_bytes()
    size = expected.stat().st_size
    assert recorder.calls == [("open", "model.safetensors"), ("write", "model.safetensors", size),
                              ("close", "model.safetensors")]
    assert (tmp_path / "outside.safetensors").exists()


def test_namespace_hooks_name_staged_files_and_rmtree_unlinks(tmp_path):
    root, staging = tmp_path / "ckpt", tmp_path / "tmp"
    (root / "old").mkdir(parents=True)
    staging.mkdir()
    (root / "old" / "a.bin").write_bytes(b"x")
    (staging / "tmp123").write_bytes(b"y")
    ops: list[tuple] = []
    hooks = NamespaceHooks(root, lambda kind, **fields: ops.append((kind, fields)), staging=staging)
    hooks.install()
    try:
        shutil.move(str(staging / "tmp123"), str(root / "last.ckpt"))
        shutil.rmtree(root / "old")
        os.unlink(tmp_path / "elsewhere") if (tmp_path / "elsewhere").exists() else None
    finally:
        hooks.uninstall()
    assert ("rename", {"path": "$TMPDIR/tmp123", "target": "last.ckpt"}) in ops
    assert ("unlink", {"path": "old/a.bin"}) in ops
    assert ("rmdir", {"path": "old"}) in ops
