"""The package's top level as a user meets it after `import braze as bz`."""
import subprocess
import sys

import pytest


def test_models_load_on_first_use_in_a_fresh_interpreter():
    """bz.models works without importing braze.models first (a test that ran alone had failed
    where another had imported it before)."""
    code = "import braze as bz; print(bz.models.bert_tiny().name)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "bert_tiny"


def test_an_unknown_attribute_is_still_an_attribute_error():
    import braze as bz

    with pytest.raises(AttributeError, match="no attribute 'modles'"):
        bz.modles  # noqa: B018


def test_test_files_have_unique_basenames():
    """tests/ has no __init__.py files: pytest imports each test module by its basename, so two
    files of one name in different folders stop the whole suite's collection."""
    from collections import Counter
    from pathlib import Path

    names = Counter(p.name for p in Path(__file__).parent.rglob("test_*.py"))
    assert [n for n, c in names.items() if c > 1] == []
