import pytest
from pydantic import BaseModel, ConfigDict, Field

from tradewind.core import ConfigError, load_config


class Inner(BaseModel):
    model_config = ConfigDict(extra="forbid")
    rate: float = 0.1


class Outer(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    steps: int = Field(default=10, gt=0)
    inner: Inner = Inner()


def test_yaml_config_loads_with_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("name: a\ninner:\n  rate: 0.5\n")
    config = load_config(Outer, path, overrides=["steps=20", "inner.rate=1e-3"])
    assert config == Outer(name="a", steps=20, inner=Inner(rate=1e-3))


def test_bad_field_error_names_file_and_field(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("name: a\nsteps: -1\ninner:\n  rate: fast\n")
    with pytest.raises(ConfigError) as caught:
        load_config(Outer, path)
    message = str(caught.value)
    assert f"{path}: steps: Input should be greater than 0" in message
    assert f"{path}: inner.rate:" in message


def test_unknown_field_is_an_error(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("name: a\nstepz: 3\n")
    with pytest.raises(ConfigError, match="stepz: Extra inputs are not permitted"):
        load_config(Outer, path)


def test_invalid_yaml_error_names_the_line(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("name: a\nsteps: [1, 2\n")
    with pytest.raises(ConfigError, match=rf"{path}:\d+: not valid YAML"):
        load_config(Outer, path)


def test_malformed_override_is_an_error(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("name: a\n")
    with pytest.raises(ConfigError, match="expected key=value"):
        load_config(Outer, path, overrides=["steps"])


def test_missing_config_file_is_reported(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(Outer, tmp_path / "absent.yaml")
