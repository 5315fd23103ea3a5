"""posttrainllm.atomic: a write that fails part-way leaves the old file whole and no temporary file."""

import os

import pytest

from posttrainllm import atomic


def test_write_replaces_the_file(tmp_path):
    path = tmp_path / "vocab.bpe"
    path.write_text("old")
    atomic.write_text(path, "new ✓")
    assert path.read_text(encoding="utf-8") == "new ✓"
    assert [p.name for p in tmp_path.iterdir()] == ["vocab.bpe"]


def test_a_failure_part_way_keeps_the_old_file(tmp_path):
    path = tmp_path / "model.pt"
    path.write_bytes(b"old weights")
    with pytest.raises(RuntimeError, match="disk full"), atomic.replacing(path) as tmp:
        tmp.write_bytes(b"half of the new")
        raise RuntimeError("disk full")
    assert path.read_bytes() == b"old weights"
    assert [p.name for p in tmp_path.iterdir()] == ["model.pt"]


def test_a_new_file_appears_only_when_complete(tmp_path):
    path = tmp_path / "cache.txt"
    with atomic.replacing(path) as tmp:
        tmp.write_bytes(b"data")
        assert not path.exists()  # nothing at the target until the block ends
    assert path.read_bytes() == b"data"


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_a_new_file_gets_the_mode_the_umask_gives(tmp_path, umask, mode):
    before = os.umask(umask)
    try:
        atomic.write_text(tmp_path / "tokenizer.bpe", "ranks")
    finally:
        os.umask(before)
    assert (tmp_path / "tokenizer.bpe").stat().st_mode & 0o7777 == mode


def test_a_replaced_file_keeps_its_mode(tmp_path):
    path = tmp_path / "model.pt"
    path.write_bytes(b"old")
    path.chmod(0o640)
    atomic.write_bytes(path, b"new")
    assert path.stat().st_mode & 0o7777 == 0o640
