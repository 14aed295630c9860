"""Errors a user can act on: each says what is wrong, where, and how to fix it."""

from __future__ import annotations


class AcrbError(Exception):
    """An error caused by the user's inputs or environment, reported without a traceback.

    ``problem`` names the bad input (a file, a params key, a model key); ``fix`` says what to do.
    """

    def __init__(self, problem: str, fix: str | None = None) -> None:
        self.problem = problem
        self.fix = fix
        super().__init__(problem if fix is None else f"{problem}\n  fix: {fix}")

    def __reduce__(self) -> tuple[type, tuple[str, str | None]]:
        # Raised in a worker process, it arrives in the stage's process with its fix apart.
        return type(self), (self.problem, self.fix)


class ConfigError(AcrbError):
    """params.yaml (or a config file it names) is invalid."""


class InputDataError(AcrbError):
    """An input file (image, catalog, table) is missing, corrupt or empty."""


def file_system_error(exc: OSError) -> AcrbError | None:
    """One line naming the path and the fix for an ``OSError`` a stage met while reading or
    writing its files (a read-only folder, a full disk, a file where a folder should be), or
    None for an ``OSError`` that is not about files (a refused connection, a timeout).

    The CLI reports every such error through this, so no stage needs its own handler. A
    temporary name (``.tmp-*``, see :mod:`acrb.storage`) is reported as its folder, the place
    the user can fix.
    """
    import errno
    import os
    from pathlib import Path

    file_codes = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.ENOTDIR,
                  errno.EISDIR, errno.EEXIST, errno.ENOENT, getattr(errno, "EDQUOT", errno.ENOSPC)}
    raw = exc.filename if exc.filename is not None else exc.filename2
    if isinstance(exc, (ConnectionError, TimeoutError)) or (raw is None
                                                            and exc.errno not in file_codes):
        return None
    path = Path(os.fsdecode(raw)) if isinstance(raw, (str, bytes, os.PathLike)) else None
    if path is not None and path.name.startswith(".tmp-"):
        where = f"the folder {path.parent}"
        folder = path.parent
    elif path is not None:
        where, folder = str(path), path.parent
    else:
        where, folder = "an output file", Path(".")
    reason = exc.strerror or type(exc).__name__
    code = exc.errno
    if isinstance(exc, PermissionError) or code in (errno.EACCES, errno.EPERM):
        return AcrbError(f"permission denied on {where} (cannot write or read it)",
                         f"make {folder} writable by you (chmod -R u+rwX {folder}), or run as "
                         "its owner; earlier outputs were left as they were")
    if code == errno.EROFS:
        return AcrbError(f"cannot write {where}: the file system is read-only",
                         "run the stage in a writable copy of the project")
    if code in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
        return AcrbError(f"cannot write {where}: no space left on the device",
                         f"free disk space where {folder} is (or move the project), then rerun; "
                         "earlier outputs were left as they were")
    if isinstance(exc, NotADirectoryError) or code == errno.ENOTDIR:
        return AcrbError(f"cannot use {where}: a part of the path is a file where a folder "
                         "should be", "move or delete that file, then rerun")
    if isinstance(exc, IsADirectoryError) or code == errno.EISDIR:
        return AcrbError(f"cannot use {where}: it is a folder where a file should be",
                         "move or delete that folder, then rerun")
    if isinstance(exc, FileExistsError) or code == errno.EEXIST:
        return AcrbError(f"cannot create the folder {where}: a file of that name exists",
                         "move or delete that file, then rerun")
    if isinstance(exc, FileNotFoundError) or code == errno.ENOENT:
        return AcrbError(f"{where} not found",
                         "restore it, or rerun the stage that writes it (dvc repro)")
    return AcrbError(f"cannot read or write {where}: {reason}",
                     "check the disk and the folder's permissions, then rerun")
