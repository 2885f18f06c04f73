"""The embedded mode's private folder and the secrets generated into it.

The embedded mode (no DATABASE_URL) keeps everything it needs under one folder,
`var/` by default: the SQLite database and its -wal/-shm files, the broker's
message files, the generated SECRET_KEY and development master key, the demo
credentials. Anyone who can read that folder can take over an admin session or
read every thread, so it is private to the account that runs Gatehouse: the
folder 0700 and every file in it 0600, whatever the umask of the shell that
started the process.

Imported by config.settings, before Django is set up: standard library only.
"""

from __future__ import annotations

import base64
import os
import secrets
from collections.abc import Callable
from pathlib import Path

PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600
# Files and folders created by an embedded process are the owner's alone: the
# SQLite -wal/-shm files, the broker's message files and anything a library
# writes later get their mode from the umask, not from code that could chmod.
PRIVATE_UMASK = 0o077


def make_private(var_dir: Path) -> None:
    """Create `var_dir` if needed and keep this process's files private.

    Cheap enough for every process start: one mkdir, one chmod, one umask.
    `secure_tree` fixes what an older version left readable.
    """
    os.umask(PRIVATE_UMASK)
    var_dir.mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)
    var_dir.chmod(PRIVATE_DIR_MODE)


def secure_tree(var_dir: Path) -> None:
    """Make every folder under `var_dir` 0700 and every file 0600 (`make run`
    does it once at start, for a folder an older version created)."""
    for root, folders, files in os.walk(var_dir):
        Path(root).chmod(PRIVATE_DIR_MODE)
        for name in folders:
            (Path(root) / name).chmod(PRIVATE_DIR_MODE)
        for name in files:
            path = Path(root) / name
            if not path.is_symlink():
                path.chmod(PRIVATE_FILE_MODE)


def generated_secret(path: Path, *, make: Callable[[], str]) -> str:
    """The secret kept in `path`; on first use, `make()` writes it (0600).

    Web, worker and beat start together: each may find the file missing. The
    secret is written whole to a private temporary file, then linked into
    place, which fails if another process got there first; the loser reads
    the winner's secret. No process ever reads a half-written file.
    """
    if not path.exists():
        temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(make() + "\n")
        try:
            os.link(temporary, path)
        except FileExistsError:
            pass
        finally:
            temporary.unlink()
    return path.read_text().strip()


def random_secret_key() -> str:
    """A SECRET_KEY as strong as Django's check --deploy asks (50+ characters,
    many distinct)."""
    return secrets.token_urlsafe(50)


def development_key_ring(path: Path, *, key_id: str) -> str:
    """A key ring of one generated key, kept in `path`: GATEHOUSE_MASTER_KEYS'
    and GATEHOUSE_AUDIT_KEYS' format ("id:base64key", 32 random bytes), which
    runs.crypto validates like any ring."""
    return generated_secret(
        path,
        make=lambda: f"{key_id}:{base64.b64encode(secrets.token_bytes(32)).decode()}",
    )
