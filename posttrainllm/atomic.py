"""Atomic file writes: a reader, or a crash part-way, sees the old file or the new one — never half.

Every file the package writes (tokenizer vocabularies, checkpoints, the cache, the study queue)
goes through :func:`replacing`: write a temporary file beside the target, flush it to disk, then
rename it over the target in one step (``os.replace`` is atomic on POSIX and Windows alike).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def replacing(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path`` to write; when the block ends without an error, the
    file is synced and moved over ``path``. On an error it is removed and ``path`` is untouched.
    A symbolic link is written through: its target gets the new content and the link stays."""
    path = Path(os.path.realpath(path))
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(name)
    os.chmod(tmp, _mode(path))  # mkstemp's 0600 would make a shared cache or a saved file private
    try:
        yield tmp
        with open(tmp, "ab") as written:  # on disk before the rename, so a power cut cannot leave it empty
            os.fsync(written.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


@contextlib.contextmanager
def locked(path: str | Path, wait: bool = True) -> Iterator[None]:
    """An exclusive lock on a sidecar file beside ``path`` for the block, so that two processes that
    read, change and replace ``path`` never lose each other's change. ``wait=False``: if another
    process holds it, raise ``BlockingIOError`` at once instead of waiting."""
    path = Path(path)
    with open(path.with_name(f".{path.name}.lock"), "a+b") as handle:
        try:
            import fcntl

            fcntl.flock(handle, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except ImportError:  # Windows
            import msvcrt

            try:
                msvcrt.locking(handle.fileno(), msvcrt.LK_LOCK if wait else msvcrt.LK_NBLCK, 1)
            except OSError as err:  # LK_NBLCK's answer when the lock is held
                if wait:
                    raise
                raise BlockingIOError(*err.args) from None
        yield  # released when the handle closes


def _mode(path: Path) -> int:
    """The mode ``path`` keeps if it exists, else the one ``open`` would give it under the umask."""
    try:
        return path.stat().st_mode & 0o7777
    except FileNotFoundError:
        return 0o666 & ~_umask()


def _umask() -> int:
    try:  # Linux says it without changing it (os.umask can only be read by setting it)
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_bytes(path: str | Path, data: bytes) -> None:
    """``Path(path).write_bytes(data)``, atomically."""
    with replacing(path) as tmp:
        tmp.write_bytes(data)


def write_text(path: str | Path, text: str) -> None:
    """``Path(path).write_text(text)`` in UTF-8, atomically."""
    write_bytes(path, text.encode("utf-8"))
