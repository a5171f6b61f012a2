"""Where arrays live on the device mesh: the mesh from its axis sizes, the rules by module and by shape, placement.

The checks run in a process with eight CPU devices (XLA's host-device flag), as multi-device runs see them.
"""

import json
import subprocess
import sys

import jax
import pytest
from jax.sharding import AbstractMesh
from jax.sharding import PartitionSpec as P
from runs_helpers import cpu_devices_env

from tradewind.core import ConfigError
from tradewind.runs import MeshConfig
from tradewind.trainer.sharding import AXES, build_mesh, param_shardings, spec_for, weight_spec

EIGHT_DEVICES = """
import json
import jax, numpy as np
from jax.sharding import PartitionSpec as P
from tradewind.core import ConfigError
from tradewind.runs import MeshConfig
from tradewind.trainer.sharding import batch_sharding, build_mesh, param_shardings, place, spec_for

out = {"devices": jax.device_count()}
mesh = build_mesh(MeshConfig(data=-1, fsdp=2, tensor=2))
out["mesh"] = dict(mesh.shape)
shapes = {"matrix": (8, 6), "odd_rows": (3, 6), "odd_cols": (8, 5), "cube": (4, 3, 2), "vector": (8,), "scalar": ()}
out["specs"] = {name: [str(d) for d in spec_for(shape, mesh)] for name, shape in shapes.items()}
errors = []
for config in (MeshConfig(data=3, fsdp=1, tensor=1), MeshConfig(data=-1, fsdp=3, tensor=1)):
    try:
        build_mesh(config)
    except ConfigError as error:
        errors.append(str(error))
out["errors"] = errors
host = {"w": np.arange(48.0).reshape(8, 6), "b": np.arange(6.0)}
placed = place(host, param_shardings(mesh, host))
out["round_trip"] = all(np.array_equal(np.asarray(placed[k]), host[k]) for k in host)
out["w_shard"] = list(placed["w"].addressable_shards[0].data.shape)
batch = place(np.zeros((8, 5)), batch_sharding(mesh))
out["batch_shard"] = list(batch.addressable_shards[0].data.shape)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def eight_devices() -> dict:
    done = subprocess.run(
        [sys.executable, "-c", EIGHT_DEVICES], capture_output=True, text=True, env=cpu_devices_env(8), timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_data_minus_one_takes_the_devices_the_other_axes_leave(eight_devices):
    assert eight_devices["devices"] == 8 and eight_devices["mesh"] == {"data": 2, "fsdp": 2, "tensor": 2}


def test_matrices_split_rows_over_fsdp_and_columns_over_tensor_where_the_sizes_divide(eight_devices):
    assert eight_devices["specs"] == {
        "matrix": ["fsdp", "tensor"],
        "odd_rows": ["None", "tensor"],
        "odd_cols": ["fsdp", "None"],
        "cube": ["fsdp", "None", "tensor"],
        "vector": [],
        "scalar": [],
    }


def test_axis_sizes_that_do_not_match_the_devices_are_refused_naming_them(eight_devices):
    assert eight_devices["errors"] == [
        "mesh: data * fsdp * tensor = 3 * 1 * 1 must equal the 8 devices",
        "mesh: fsdp * tensor = 3 does not divide 8 devices",
    ]


def test_placed_arrays_hold_the_host_values_each_device_a_shard_and_batches_split_their_rows(eight_devices):
    assert eight_devices["round_trip"]
    assert eight_devices["w_shard"] == [4, 3]  # 8 rows over fsdp=2, 6 columns over tensor=2
    assert eight_devices["batch_shard"] == [2, 5]  # 8 rows over data x fsdp = 4


def test_on_one_device_nothing_is_split():
    mesh = build_mesh(MeshConfig(), devices=jax.devices()[:1])
    assert dict(mesh.shape) == {"data": 1, "fsdp": 1, "tensor": 1}
    assert spec_for((8, 6), mesh) == P(None, None)
    with pytest.raises(ConfigError, match="must equal the 1 devices"):
        build_mesh(MeshConfig(data=2), devices=jax.devices()[:1])


def specs_of(architecture: str, mesh, scan_layers: bool = False) -> dict[str, P]:
    """Each weight's partition spec, by its path in the model (block 0 standing for every block)."""
    from flax import nnx

    from tradewind.runs import model_config
    from tradewind.trainer.models import build_model

    config = model_config(type=architecture, vocab_size=64, d_model=32, n_layers=1, n_heads=4, max_seq_len=16)
    _, params = nnx.split(nnx.eval_shape(lambda: build_model(config, rngs=nnx.Rngs(0), scan_layers=scan_layers)))
    return {
        jax.tree_util.keystr(path).removesuffix(".value"): sharding.spec
        for path, sharding in jax.tree_util.tree_flatten_with_path(param_shardings(mesh, params))[0]
    }


def test_weights_split_megatrons_way_columns_then_rows_and_the_vocabulary_over_tensor():
    mesh = AbstractMesh((2, 2, 2), AXES)
    llama = specs_of("llama", mesh)
    for name in ("q_proj", "k_proj", "v_proj"):
        assert llama[f"['blocks'][0]['attn']['{name}']['kernel']"] == P("fsdp", "tensor")  # column-parallel
    assert llama["['blocks'][0]['attn']['o_proj']['kernel']"] == P("tensor", "fsdp")  # row-parallel
    assert llama["['blocks'][0]['mlp']['gate_proj']['kernel']"] == P("fsdp", "tensor")
    assert llama["['blocks'][0]['mlp']['down_proj']['kernel']"] == P("tensor", "fsdp")
    assert llama["['embed']['embedding']"] == P(("tensor", "fsdp"), None)  # rows over both
    assert llama["['norm']['scale']"] == P()
    # An untied head splits its vocabulary the same way and keeps its width whole.
    assert weight_spec(["lm_head", "kernel"], (32, 64), mesh) == P(None, ("tensor", "fsdp"))
    gpt2 = specs_of("gpt2", mesh)
    assert gpt2["['blocks'][0]['attn']['qkv']['bias']"] == P("tensor")
    assert gpt2["['blocks'][0]['fc_out']['kernel']"] == P("tensor", "fsdp")
    assert gpt2["['wpe']['embedding']"] == P(None, "fsdp")
    # A scanned model's stacked weights keep the layer axis whole and split the rest as one layer's.
    stacked = specs_of("llama", mesh, scan_layers=True)
    assert stacked["['blocks']['layer']['attn']['o_proj']['kernel']"] == P(None, "tensor", "fsdp")
    assert stacked["['blocks']['layer']['attn_norm']['scale']"] == P(None)


def test_an_optimizer_moment_lands_where_its_parameter_does_and_a_factored_one_stays_whole():
    from tradewind.runs import OptimizerConfig
    from tradewind.trainer.optimizer import build_optimizer

    mesh = AbstractMesh((2, 2, 2), AXES)
    kernel = {"blocks": {0: {"mlp": {"down_proj": {"kernel": jax.ShapeDtypeStruct((96, 32), "float32")}}}}}
    adam = param_shardings(mesh, jax.eval_shape(build_optimizer(OptimizerConfig()).init, kernel))
    moments = [s.spec for s in jax.tree.leaves(adam) if s.spec != P()]
    assert moments == [P("tensor", "fsdp"), P("tensor", "fsdp")]  # mu and nu
    large = {"blocks": {0: {"mlp": {"down_proj": {"kernel": jax.ShapeDtypeStruct((256, 256), "float32")}}}}}
    factored = jax.eval_shape(build_optimizer(OptimizerConfig(type="adafactor")).init, large)  # row and column sums
    assert {x.shape for x in jax.tree.leaves(factored)} == {(), (1,), (256,)}
    assert all(s.spec == P() for s in jax.tree.leaves(param_shardings(mesh, factored)))
