"""Test files are collected without packages (no __init__.py under tests/), so pytest imports each by its
basename: two files of one name in different folders stop collection with "import file mismatch"."""

from collections import Counter
from pathlib import Path


def test_every_test_file_has_a_unique_basename():
    names = Counter(path.name for path in Path(__file__).parents[1].rglob("test_*.py"))
    assert [name for name, count in names.items() if count > 1] == []
