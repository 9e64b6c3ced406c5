"""Which filesystem a path lives on, and whether inotify can be trusted there."""

from __future__ import annotations

import os
from pathlib import Path

NETWORK_FS = {
    "nfs",
    "nfs4",
    "cifs",
    "smb3",
    "smbfs",
    "lustre",
    "gpfs",
    "ceph",
    "glusterfs",
    "beegfs",
    "afs",
    "9p",
    "panfs",
    "wekafs",
    "virtiofs",
    "cvmfs",
}


def filesystem_type(path: Path) -> str | None:
    """The fstype of the mount holding ``path`` (Linux /proc/mounts), or None if unknown."""
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return None
    target = os.path.realpath(path)
    best, fstype = "", None
    for line in mounts:
        parts = line.split()
        if len(parts) < 3:
            continue
        mnt = parts[1].replace("\\040", " ")
        if (target == mnt or target.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
            best, fstype = mnt, parts[2]
    return fstype


def needs_polling(path: Path) -> str | None:
    """The fstype when inotify cannot be trusted there (network or FUSE), else None."""
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    fstype = filesystem_type(probe)
    if fstype and (fstype in NETWORK_FS or fstype.startswith("fuse")):
        return fstype
    return None
