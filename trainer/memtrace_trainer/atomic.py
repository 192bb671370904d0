"""Atomic output files, the Python side's one writer (the Rust side's is `trace/src/atomic.rs`):
a reader never sees half a file, a failed write leaves nothing behind, and the file is 0644 as
the Rust side's are (`mkstemp`'s 0600 would hide results from the rest of a team)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from memtrace_trainer.errors import UserError


def cannot_write(path: Path, e: OSError) -> UserError:
    """A failed write of the user's output, said as such (a directory in the way, a full disk, a
    file size limit), naming the output rather than the temporary file beside it."""
    return UserError(f"cannot write {path}: {e.strerror or e}")


def check_output_file(path: Path, flag: str, expected: str) -> None:
    """The one check of an output file's path, made before any work: a folder in its place, or
    a folder above it that does not exist, is refused naming the flag (every `--out FILE` alike:
    a file's folder is never made for it; folders the user names, `run --out DIR` and
    `--out-dir`, are)."""
    path = Path(path)
    if path.is_dir():
        raise UserError(f"{flag} {path}: is a directory; expected {expected}")
    if not path.parent.is_dir():
        above = path.parent
        while not above.exists() and above != above.parent:
            above = above.parent
        if above.exists() and not above.is_dir():
            raise UserError(f"{flag} {path}: {above} is not a directory")
        raise UserError(f"{flag} {path}: directory {path.parent} does not exist")


@contextmanager
def replacing(path: Path, suffix: str = "") -> Iterator[Path]:
    """A temporary file beside `path` (ending in `suffix`, for tools that go by the extension),
    moved over `path` when the block ends without an error and removed otherwise. A symbolic
    link is written where it points, as a shell's `>` writes it (moved over, the link was replaced
    and its target left as it was), as the Rust side's writer does."""
    target = Path(os.path.realpath(path))
    try:
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=suffix)
        os.close(fd)
    except OSError as e:
        raise cannot_write(path, e) from e
    try:
        os.chmod(tmp, 0o644)
        yield Path(tmp)
        try:
            os.replace(tmp, target)
        except OSError as e:
            raise cannot_write(path, e) from e
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_text(path: Path, text: str) -> None:
    """`text` into `path`, atomically."""
    with replacing(path) as tmp:
        try:
            tmp.write_text(text)
        except OSError as e:
            raise cannot_write(path, e) from e
