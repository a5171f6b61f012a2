"""`lazy_getattr`: a package's names load on first use (PEP 562), so importing the package stays cheap."""

import subprocess
import sys

import pytest


@pytest.fixture
def package(tmp_path, monkeypatch):
    """A package `lazypkg` whose `VALUE` lives in `lazypkg.heavy`, exported through `lazy_getattr`."""
    root = tmp_path / "lazypkg"
    root.mkdir()
    (root / "__init__.py").write_text(
        "from tradewind.core import lazy_getattr\n__getattr__ = lazy_getattr(__name__, {'VALUE': 'lazypkg.heavy'})\n"
    )
    (root / "heavy.py").write_text("VALUE = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("lazypkg", "lazypkg.heavy"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    import lazypkg

    yield lazypkg
    for name in ("lazypkg", "lazypkg.heavy"):
        sys.modules.pop(name, None)


def test_a_lazy_name_loads_its_module_on_first_use_and_is_kept_on_the_package(package):
    assert "lazypkg.heavy" not in sys.modules
    from lazypkg import VALUE

    assert VALUE == 42 and "lazypkg.heavy" in sys.modules
    assert vars(package)["VALUE"] == 42  # later look-ups skip __getattr__


def test_an_unknown_name_raises_attribute_error_naming_the_package(package):
    with pytest.raises(AttributeError, match="module 'lazypkg' has no attribute 'missing'"):
        package.missing  # noqa: B018
    assert not hasattr(package, "missing")


@pytest.mark.parametrize("package", ["tradewind.core", "tradewind.cluster"])
def test_every_exported_name_resolves(package):
    module = __import__(package, fromlist=["__all__"])
    missing = [name for name in module.__all__ if not hasattr(module, name)]
    assert missing == []


def test_importing_core_and_cluster_loads_neither_pydantic_nor_fsspec():
    code = (
        "import sys, tradewind.core, tradewind.cluster\n"
        "print([m for m in ('pydantic', 'yaml', 'fsspec') if m in sys.modules])"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
