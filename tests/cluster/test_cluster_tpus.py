"""The TPU slice table: hosts, chips and torus of every type Cloud sells, and what each chip has."""

import math

import pytest

from tradewind.cluster import TPU_TYPES, tpu_slice


@pytest.mark.parametrize(
    ("tpu_type", "hosts", "chips", "jax_topology", "host_bounds"),
    [
        ("v4-8", 1, 4, "v4:2x2x1", (2, 2, 1)),
        ("v4-32", 4, 16, "v4:2x2x4", (2, 2, 1)),
        ("v4-4096", 512, 2048, "v4:8x16x16", (2, 2, 1)),
        ("v5p-8", 1, 4, "v5p:2x2x1", (2, 2, 1)),
        ("v5p-128", 16, 64, "v5p:4x4x4", (2, 2, 1)),
        ("v5litepod-1", 1, 1, "v5e:1x1", (1, 1, 1)),
        ("v5litepod-8", 1, 8, "v5e:2x4", (2, 4, 1)),
        ("v5e-16", 4, 16, "v5e:4x4", (2, 2, 1)),
        ("v5litepod-256", 64, 256, "v5e:16x16", (2, 2, 1)),
        ("v6e-8", 1, 8, "v6e:2x4", (2, 4, 1)),
        ("v6e-64", 16, 64, "v6e:8x8", (2, 2, 1)),
    ],
)
def test_a_slice_has_the_hosts_chips_and_torus_cloud_sells_it_with(tpu_type, hosts, chips, jax_topology, host_bounds):
    target = tpu_slice(tpu_type)
    assert (target.hosts, target.chips, target.jax_topology, target.host_bounds) == (
        hosts,
        chips,
        jax_topology,
        host_bounds,
    )


def test_every_types_torus_holds_exactly_its_chips_and_its_hosts_hold_them_too():
    for tpu_type in TPU_TYPES:
        target = tpu_slice(tpu_type)
        assert math.prod(target.torus) == target.chips == target.hosts * target.chips_per_host, tpu_type
        assert len(target.torus) == target.chip.torus_dims, tpu_type


def test_each_generation_has_its_chips_figures():
    v5e, v5p = tpu_slice("v5e-8").chip, tpu_slice("v5p-8").chip
    assert (v5e.generation, v5e.device_kind, v5e.hbm_bytes, v5e.peak_bf16_flops) == (
        "v5e",
        "TPU v5 lite",
        16 * 2**30,
        197e12,
    )
    assert (v5p.generation, v5p.device_kind, v5p.megacore, v5p.torus_dims) == ("v5p", "TPU v5", True, 3)


def test_an_unknown_type_is_refused_listing_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown TPU type 'v9-8'; known types: v4-8, "):
        tpu_slice("v9-8")


def test_each_host_of_a_two_slice_gang_gets_its_slice_and_slice_zeros_first_host_as_coordinator():
    # Ray places replicas slice by slice (`ray_bundles`). The test Ray head advertises one slice, so the variables
    # of two are checked here, where the launcher builds them; the one-slice gang runs in test_cluster_ray.py.
    from tradewind.cluster import JobSpec, Resources
    from tradewind.cluster.ray_entry import replica_env

    spec = JobSpec(name="two slices", command=["true"], resources=Resources(accelerator="tpu-v4-16", slices=2))
    envs = [replica_env(spec, i, 4, "10.0.0.5:40123") for i in range(4)]
    assert [env["MEGASCALE_SLICE_ID"] for env in envs] == ["0", "0", "1", "1"]
    assert [env["TRADEWIND_PROCESS_ID"] for env in envs] == ["0", "1", "2", "3"]
    assert {env["MEGASCALE_COORDINATOR_ADDRESS"] for env in envs} == {"10.0.0.5:8081"}
    assert {env["MEGASCALE_NUM_SLICES"] for env in envs} == {"2"}
    assert {env["TRADEWIND_COORDINATOR_ADDRESS"] for env in envs} == {"10.0.0.5:40123"}
    one_slice = JobSpec(name="one slice", command=["true"], resources=Resources(accelerator="tpu-v4-16"))
    assert not any(key.startswith("MEGASCALE") for key in replica_env(one_slice, 1, 2, "10.0.0.5:40123"))
