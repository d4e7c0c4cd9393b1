"""The package surface: cheap import, every advertised submodule exists."""
import subprocess
import sys

import pytest

import parlab

pytestmark = [pytest.mark.unit, pytest.mark.timeout(120)]


def test_import_parlab_does_not_import_torch():
    code = "import sys, parlab; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("name", sorted(parlab._SUBMODULES))
def test_every_advertised_submodule_imports(name):
    assert getattr(parlab, name).__name__ == f"parlab.{name}"


def test_unknown_attribute_is_an_attribute_error():
    with pytest.raises(AttributeError):
        parlab.no_such_thing
