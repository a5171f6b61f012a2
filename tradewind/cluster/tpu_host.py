"""The TPU chips of this host: which slice type they make, and which process holds them, read without JAX.

A Cloud TPU VM shows its chips to the kernel as PCI devices of Google's vendor id, whose device id names the
generation, and to user programs as device files: `/dev/accel<N>` (v4, older v5e images) or one VFIO group
`/dev/vfio/<N>` per chip (v5e, v5p, v6e). The chips a program here can open are those device files; the PCI
ids (or, failing them, Cloud's `TPU_ACCELERATOR_TYPE`) say their generation. So `host_tpu()` knows the host's
slice type (`v5litepod-1`, `v6e-8`, `v4-8`) from a few small files, and the server, which must never start
JAX on the chip, can still place runs there. `TRADEWIND_HOST_TPU` overrides the reading: a single-host type,
or `none` to keep a TPU host's runs on its CPU by default.

libtpu lets one process at a time use the chips: the first one holds the lock file `LIBTPU_LOCKFILE` open,
and any other fails to start its TPU backend. `lock_holders()` names the processes holding it, so that a run
can say who has the chips instead of passing on libtpu's traceback.

Example:
    host = host_tpu()  # TpuSlice(tpu_type='v5litepod-1', ...) on a one-chip v5e VM; None elsewhere
    lock_holders()     # [(1451, 'python3 train.py')] while another program trains there
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path

from tradewind.cluster.tpus import CHIPS, TPU_TYPES, TpuSlice, canonical_tpu_type, tpu_slice

HOST_TPU_ENV = "TRADEWIND_HOST_TPU"
GOOGLE_PCI_VENDOR = "0x1ae0"
# PCI device ids of the TPU chips, by family (as Cloud TPU's runtime and JAX's hardware table name them).
PCI_FAMILIES = {"0x005e": "v4", "0x0062": "v5p", "0x0063": "v5litepod", "0x006f": "v6e"}
LIBTPU_LOCKFILE = "/tmp/libtpu_lockfile"


def host_tpu() -> TpuSlice | None:
    """This host's TPU as one slice type, or None where it has no TPU chip (read once per process).

    Raises:
        ValueError: `TRADEWIND_HOST_TPU` names something other than a single-host TPU type or `none`.
    """
    return _host_tpu(os.environ.get(HOST_TPU_ENV, ""))


@functools.cache
def _host_tpu(override: str) -> TpuSlice | None:
    if override.strip().lower() == "none":
        return None
    if override:
        found = tpu_slice(override.strip().removeprefix("tpu-"))
        if found.hosts != 1:
            raise ValueError(f"{HOST_TPU_ENV}={override!r}: a host holds a single-host type (e.g. v5litepod-8)")
        return found
    return read_host_tpu(Path("/"), os.environ)


def read_host_tpu(root: Path, environ: dict[str, str] | os._Environ[str]) -> TpuSlice | None:
    """The TPU under the file-system root `root`: its chips from the device files a program can open, their
    family from the PCI ids (else `TPU_ACCELERATOR_TYPE`). None when there are no chips, or the files name a
    family or a count no single-host type has."""
    chips = len(_numbered(root / "dev", "accel")) or len(_numbered(root / "dev" / "vfio", ""))
    family = _pci_family(root) or _cloud_family(environ.get("TPU_ACCELERATOR_TYPE", ""))
    if not chips or family is None:
        return None
    size = chips * 2 if CHIPS[family].megacore else chips  # v4 and v5p types count TensorCores, two a chip
    name = f"{family}-{size}"
    if name not in TPU_TYPES or TPU_TYPES[name][0] != 1:
        return None
    return tpu_slice(name)


def _numbered(folder: Path, prefix: str) -> list[Path]:
    """The files `<prefix><N>` in `folder` (the chips' device files)."""
    try:
        return [path for path in folder.iterdir() if re.fullmatch(rf"{prefix}\d+", path.name)]
    except OSError:
        return []


def _pci_family(root: Path) -> str | None:
    for device in sorted(_subfolders(root / "sys" / "bus" / "pci" / "devices")):
        if _read(device / "vendor") == GOOGLE_PCI_VENDOR and (family := PCI_FAMILIES.get(_read(device / "device"))):
            return family
    return None


def _cloud_family(accelerator_type: str) -> str | None:
    """The family of Cloud's accelerator type (`v5litepod-4`, `v6e-8`), or None for anything else."""
    try:
        return canonical_tpu_type(accelerator_type).partition("-")[0] if accelerator_type else None
    except ValueError:
        return None


def _subfolders(folder: Path) -> list[Path]:
    try:
        return list(folder.iterdir())
    except OSError:
        return []


def _read(path: Path) -> str:
    try:
        return path.read_text().strip().lower()
    except OSError:
        return ""


def lock_holders(lockfile: str = LIBTPU_LOCKFILE) -> list[tuple[int, str]]:
    """The processes (pid, command line) that hold libtpu's lock file open, as far as this user can see them;
    empty when none does."""
    holders = []
    for proc in _subfolders(Path("/proc")):
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            held = any(os.readlink(fd) == lockfile for fd in (proc / "fd").iterdir())
        except OSError:  # gone, or another user's
            continue
        if held:
            command = _read_bytes(proc / "cmdline").replace(b"\0", b" ").decode(errors="replace").strip()
            holders.append((int(proc.name), command[:200]))
    return holders


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


def describe_holders(holders: list[tuple[int, str]], lockfile: str = LIBTPU_LOCKFILE) -> str:
    """Who holds the chips and what to do, for a message: one process at a time can use them."""
    named = ", ".join(f"process {pid} ({command or 'command unknown'})" for pid, command in holders)
    if any("tradewind.cluster.warm --serve" in command for _, command in holders):
        named += (
            ", Tradewind's warm process, which keeps the chips open between runs of a workspace until it has had no "
            "job for a while (`tradewind cluster release` in that workspace ends it now)"
        )
    who = named or "a process this user cannot see"
    return (
        f"this host's TPU chips are held by {who}, which holds libtpu's lock file {lockfile}; one process at a "
        "time can use them: wait for it to end or stop it"
        + (f" (kill {' '.join(str(pid) for pid, _ in holders)})" if holders else "")
        + ", then launch again"
    )
