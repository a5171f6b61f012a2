"""This host's TPU, read without JAX: the chips from the device files, their family from the PCI ids, and who holds
libtpu's lock. The file trees below are laid out as a Cloud TPU VM's kernel shows them (this machine has no TPU;
`tests/tpu/` checks the reading on a real chip)."""

import pytest
from tpu_helpers import holding_open

from tradewind.cluster.placement import parse_accelerator
from tradewind.cluster.tpu_host import HOST_TPU_ENV, describe_holders, host_tpu, lock_holders, read_host_tpu


def tpu_vm(root, *, pci_device: str | None, vfio_groups: int = 0, accel_files: int = 0, pci_devices: int = 4):
    """A root folder with what a TPU VM shows: the chips' PCI devices, and their device files."""
    for index in range(pci_devices if pci_device else 0):
        device = root / "sys" / "bus" / "pci" / "devices" / f"0000:00:{index + 8:02x}.0"
        device.mkdir(parents=True)
        (device / "vendor").write_text("0x1ae0\n")
        (device / "device").write_text(f"{pci_device}\n")
    (root / "dev" / "vfio").mkdir(parents=True)
    (root / "dev" / "vfio" / "vfio").write_text("")  # the VFIO container, not a chip
    for group in range(vfio_groups):
        (root / "dev" / "vfio" / str(group)).write_text("")
    for index in range(accel_files):
        (root / "dev" / f"accel{index}").write_text("")
    return root


@pytest.mark.parametrize(
    ("layout", "environ", "expected"),
    [
        # The lent v5e machine: four chips on the bus, one VFIO group (one chip) this program can open.
        ({"pci_device": "0x0063", "vfio_groups": 1}, {"TPU_ACCELERATOR_TYPE": "v5litepod-4"}, "v5litepod-1"),
        ({"pci_device": "0x0063", "vfio_groups": 4}, {}, "v5litepod-4"),
        ({"pci_device": "0x006f", "vfio_groups": 8, "pci_devices": 8}, {}, "v6e-8"),
        ({"pci_device": "0x005e", "accel_files": 4}, {}, "v4-8"),  # v4 counts TensorCores, two a chip
        ({"pci_device": "0x0062", "vfio_groups": 4}, {}, "v5p-8"),
        ({"pci_device": None, "vfio_groups": 1}, {"TPU_ACCELERATOR_TYPE": "v5litepod-1"}, "v5litepod-1"),
    ],
    ids=["v5e-one-of-four", "v5e-4", "v6e-8", "v4-8", "v5p-8", "family-from-cloud-variable"],
)
def test_the_hosts_tpu_is_its_openable_chips_of_the_family_its_pci_ids_name(tmp_path, layout, environ, expected):
    assert read_host_tpu(tpu_vm(tmp_path, **layout), environ).tpu_type == expected


@pytest.mark.parametrize(
    "layout",
    [
        {"pci_device": None},  # no TPU at all
        {"pci_device": "0x0063"},  # chips on the bus that this program cannot open
        {"pci_device": None, "vfio_groups": 1},  # a VFIO device of something else, no family named
        {"pci_device": "0x0063", "vfio_groups": 2},  # a count no single-host v5e type has
    ],
    ids=["none", "not-openable", "other-vfio-device", "unsold-count"],
)
def test_a_host_without_openable_chips_of_a_known_type_has_no_tpu(tmp_path, layout):
    assert read_host_tpu(tpu_vm(tmp_path, **layout), {}) is None


def test_the_override_names_the_hosts_tpu_or_none_and_refuses_a_type_of_several_hosts(monkeypatch):
    monkeypatch.setenv(HOST_TPU_ENV, "v5e-8")
    assert host_tpu().tpu_type == "v5litepod-8"
    assert str(parse_accelerator("tpu")) == "tpu-v5litepod-8"
    monkeypatch.setenv(HOST_TPU_ENV, "none")
    assert host_tpu() is None
    with pytest.raises(ValueError, match="accelerator 'tpu' means this host's TPU chips, and this host has none"):
        parse_accelerator("tpu")
    monkeypatch.setenv(HOST_TPU_ENV, "v5litepod-16")
    with pytest.raises(ValueError, match="a host holds a single-host type"):
        host_tpu()


def test_the_processes_holding_libtpus_lock_are_named_with_what_to_do(tmp_path):
    lockfile = tmp_path / "libtpu_lockfile"
    with holding_open(str(lockfile)) as holder:
        holders = lock_holders(str(lockfile))
        assert [pid for pid, _ in holders] == [holder.pid]
        assert str(lockfile) in holders[0][1]  # its command line
        message = describe_holders(holders, str(lockfile))
        assert f"held by process {holder.pid} (" in message and f"kill {holder.pid}" in message
        assert f"libtpu's lock file {lockfile}" in message
    assert lock_holders(str(lockfile)) == []
