"""The listener roles of a fault that acts on files: on the writes of a save (`WriteListener`,
through `resilience.disk.interception`) or on the reads of a restore (`ReadListener`, through
`resilience.disk.read_interception`). A fault takes a role by inheriting it besides `Fault`; the
rank installs an interception layer only for a fault that has the role and asks for it."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..disk.interception import InterceptedFile
    from ..disk.read_interception import InterceptedReader


class WriteListener:
    """Sees the writes of files under the checkpoint directory (and those staged in the rank's
    $TMPDIR, named ``$TMPDIR/...``): `resilience.disk.interception.IOListener`, implemented.

    Call order. The worker (or a helper's startup hook, or the black-box hook) asks
    ``needs_interception()`` once per process, right before or after ``arm``; only when it is true
    is the interception layer installed, in that process. Then, per file opened for writing:
    ``wants(relative)`` as it is opened; for a file some listener wants, ``on_open`` once,
    ``on_write`` before each write, ``on_fsync`` before each fsync, ``before_close`` then
    ``after_close`` once. Every call runs in the thread that does the IO (a background writer
    thread in an async save), in the process that does it: a rank, or a helper process its
    library started (``env.process == "helper"``) when ``reaches_helpers()``.
    """

    def needs_interception(self) -> bool:
        """Whether this process routes checkpoint writes through the interception layer (asked once)."""
        return True

    def wants(self, relative: str) -> bool:
        """As a file is opened for writing, in the opening thread: whether this fault sees its writes."""
        return True

    def on_open(self, file: InterceptedFile) -> None:
        """Once, right after a wanted file was opened, in the opening thread."""

    def on_write(self, file: InterceptedFile, data: Any, nbytes: int) -> None:
        """Before each write of ``nbytes`` (``file.offset``: where it lands), in the writing thread;
        it may write a prefix itself (``file.write_through``) and then raise or end the process."""

    def on_fsync(self, file: InterceptedFile) -> None:
        """Before each ``os.fsync`` of the file, in the thread that calls it."""

    def before_close(self, file: InterceptedFile) -> None:
        """Once, as the file is closed, before the real close (an error raised here is the close's)."""

    def after_close(self, file: InterceptedFile) -> None:
        """Once, right after the real close (the file is complete on disk), in the closing thread."""


class ReadListener:
    """Sees the reads of files under the checkpoint directory: a restore's reads, in the ranks of
    the restart (a fault with ``arms_at_restart``): `resilience.disk.read_interception.ReadListener`,
    implemented.

    Call order. The worker asks ``needs_read_interception()`` once per rank process, after ``arm``
    (it may depend on ``env.incarnation``); only when it is true is the read interception installed.
    Then, per file opened for reading: ``wants_read(relative)`` as it is opened; for a file some
    listener wants, ``on_open_read(path, relative)`` once, before the real open, then ``on_read``
    before each read. Every call runs in the thread that reads, in the rank process.
    """

    def needs_read_interception(self) -> bool:
        """Whether this rank routes reads under the checkpoint directory through the read
        interception layer (asked once, after ``arm``)."""
        return True

    def wants_read(self, relative: str) -> bool:
        """As a file is opened for reading, in the opening thread: whether this fault sees its reads."""
        return True

    def on_open_read(self, path: Path, relative: str) -> None:
        """Once, before the real open of a wanted file (it may raise, as a failing filesystem does)."""

    def on_read(self, file: InterceptedReader, nbytes: int) -> None:
        """Before each read of up to ``nbytes`` (-1: to the end), in the reading thread; it may
        raise or sleep."""


def hooks_of(role: type) -> tuple[str, ...]:
    """The methods a listener role declares (a `Fault` that defines one of them must take the role)."""
    return tuple(name for name, value in vars(role).items() if callable(value) and not name.startswith("_"))
