"""Output folders that are never overwritten, also not by a run started at the same moment.

A run holds an exclusive ``flock`` on ``<folder>/.lock`` for as long as it writes there
(the operating system releases it when the process ends, however it ends), and checks
that the folder is empty only once it holds the lock: of two runs that pick the same
folder at once, one gets it and the other is refused. A default folder
(``runs/<stem>-<time>``) is made with ``mkdir(exist_ok=False)`` and takes a ``-2``,
``-3``, ... suffix when the name is taken, so two runs started in the same second get two
folders. A folder the user names may already exist if it is empty. A failed start removes
what it created (the lock file, and the folder if it made it), so it leaves no empty
folder behind.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import os
from dataclasses import dataclass
from pathlib import Path

LOCK = ".lock"


class OutputFolderError(ValueError):
    """The output folder cannot be used (the message names the option and why)."""


@dataclass
class ClaimedFolder:
    """A folder this run holds the lock of: ``path``, and whether the run created it."""

    path: Path
    created: bool
    fd: int | None = None

    def release(self) -> None:
        """Give the lock back (also done by the operating system at exit)."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def release_if_unused(self) -> None:
        """After a failed start: give the lock back and, if nothing but the lock file is
        in the folder, remove the lock file and (when this run made it) the folder."""
        self.release()
        if not self.path.is_dir():
            return
        if all(p.name == LOCK for p in self.path.iterdir()):
            (self.path / LOCK).unlink(missing_ok=True)
            if self.created:
                self.path.rmdir()


def _lock(path: Path, created: bool, option: str, must_be_empty: bool) -> ClaimedFolder:
    try:
        fd = os.open(path / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise OutputFolderError(f"{option} {str(path)!r} is not writable: "
                                f"{e.strerror or e}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise OutputFolderError(f"{option} {str(path)!r} is in use by another run (started "
                                "at the same moment?); choose another folder") from None
    claimed = ClaimedFolder(path, created, fd)
    if must_be_empty and any(p.name != LOCK for p in path.iterdir()):
        claimed.release()
        raise OutputFolderError(f"{option} {str(path)!r} already exists and is not empty; "
                                "refusing to overwrite it: choose a new path")
    return claimed


def claim_output_dir(path: str | Path | None, stem: str, option: str = "--out",
                     root: str | Path = "runs", resume: bool = False) -> ClaimedFolder:
    """Lock ``path`` (new, or an existing empty folder) for this run, or, when ``path`` is
    ``None``, a new ``<root>/<stem>-<YYYYmmdd-HHMMSS>[-k]`` folder. With ``resume`` the
    folder must exist (and may hold files: the run it continues).

    Raises :class:`OutputFolderError` naming ``option`` when ``path`` is a file, exists
    and is not empty, is locked by another run, or cannot be created.
    """
    if path is None:
        base = Path(root) / f"{stem}-{dt.datetime.now():%Y%m%d-%H%M%S}"
        for k in range(1, 10_000):
            candidate = base if k == 1 else base.with_name(f"{base.name}-{k}")
            try:
                candidate.mkdir(parents=True, exist_ok=False)
            except FileExistsError:
                continue
            except OSError as e:
                raise OutputFolderError(f"cannot create the run folder {str(candidate)!r}: "
                                        f"{e.strerror or e}") from None
            return _lock(candidate, True, option, must_be_empty=True)
        raise OutputFolderError(f"no free run folder name under {str(root)!r}")
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise OutputFolderError(f"{option} {str(path)!r} is a file, not a folder")
    if resume:
        if not path.is_dir():
            raise OutputFolderError(f"{option} {str(path)!r} does not exist: nothing to resume")
        return _lock(path, False, option, must_be_empty=False)
    created = False
    if not path.exists():
        try:
            path.mkdir(parents=True, exist_ok=False)
            created = True
        except FileExistsError:
            pass  # made by a run started at the same moment: the lock decides
        except OSError as e:  # NotADirectoryError (a file on the path), PermissionError
            raise OutputFolderError(f"{option} {str(path)!r} cannot be created: "
                                    f"{e.strerror or e}") from None
    return _lock(path, created, option, must_be_empty=True)
