"""relm's rooms import only downward, and no two files import each other (issue 16).

Every module under relm/ is parsed with `ast`: module-level imports, imports inside functions and
under `if TYPE_CHECKING:` (a design dependency even when it costs nothing at run time), and
`importlib.import_module("relm....")` with a literal name. An import from a room higher in
docs/design.md's "Layout" than the importing file's own fails, and so does any cycle between files
(strongly connected components of the file graph, networkx's, which torch already requires).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import NamedTuple

import networkx as nx

REPO = Path(__file__).resolve().parents[2]

ROOMS: tuple[tuple[str, ...], ...] = (
    ("relm", "errors", "logs", "processes"),  # relm/__init__.py, errors.py, logs.py, processes.py
    ("config",),
    ("algorithms",),
    ("models",),
    ("data",),
    ("memory",),
    ("rollout",),  # rollout/native/ inside it
    ("distributed",),
    ("rewards",),
    ("learner",),
    ("trainer",),
    ("compat",),
    ("bench",),
    ("cli", "export"),
)
"""Bottom up, as docs/design.md lists them: a room imports only from itself and the rooms before it."""

PENDING_CYCLES: set[frozenset[str]] = set()
"""File cycles known and being removed on another branch (none now); any other cycle fails."""


class Import(NamedTuple):
    source: str
    """The importing module."""
    target: str
    """The imported module (a package's `__init__` when a name is not a submodule)."""
    path: Path
    line: int
    via_package: bool = False
    """An edge to a package whose `__init__` runs because one of its modules was imported."""

    def where(self, root: Path) -> str:
        how = f"imports {self.target}" + (" (its package's __init__ runs)" if self.via_package else "")
        return f"{self.path.relative_to(root)}:{self.line} {how}"


def module_files(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file under root/relm."""
    modules = {}
    for path in sorted((root / "relm").rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> list[Import]:
    """Every import of a relm module in one file, at any depth."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[tuple[str, int]] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                found.append((submodule if submodule in modules else base, node.lineno))
        elif (
            isinstance(node, ast.Call)
            and (getattr(node.func, "attr", None) or getattr(node.func, "id", None)) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.append((node.args[0].value, node.lineno))
    imports = []
    for target, line in dict.fromkeys(found):  # `from m import a, b` is one import of m
        while target and target not in modules:  # a name that is not a module: the module holding it
            target = target.rpartition(".")[0]
        if not target.startswith("relm") or target == name:
            continue
        imports.append(Import(name, target, path, line))
        # Importing relm.x.y runs relm/x/__init__.py first, unless the importer is inside relm.x.
        parent = target.rpartition(".")[0]
        while parent.count(".") >= 1 and not (name == parent or name.startswith(parent + ".")):
            imports.append(Import(name, parent, path, line, via_package=True))
            parent = parent.rpartition(".")[0]
    return imports


def all_imports(root: Path) -> list[Import]:
    modules = module_files(root)
    return [imp for name, path in modules.items() for imp in imports_of(name, path, modules)]


def room_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def rank_of(module: str) -> int:
    room = room_of(module)
    for rank, names in enumerate(ROOMS):
        if room in names:
            return rank
    raise KeyError(room)


def upward_imports(imports: list[Import], root: Path) -> list[str]:
    """One line per import of a higher room, naming the file, the line and the rooms (a package's
    `__init__` is in its modules' room, so the import of the module itself stands for it)."""
    return [
        f"{imp.where(root)}: room `{room_of(imp.target)}` is above `{room_of(imp.source)}` in "
        f"docs/design.md's Layout; move what is shared down, or have the caller pass it in"
        for imp in imports
        if not imp.via_package and rank_of(imp.target) > rank_of(imp.source)
    ]


def file_cycles(imports: list[Import], root: Path, allowed: set[frozenset[str]]) -> list[str]:
    """One paragraph per strongly connected set of files, listing the imports that tie it."""
    graph = nx.DiGraph((imp.source, imp.target) for imp in imports)
    problems = []
    for members in nx.strongly_connected_components(graph):
        if len(members) < 2 or frozenset(members) in allowed:
            continue
        ties = sorted(imp.where(root) for imp in imports if imp.source in members and imp.target in members)
        problems.append(f"import cycle between {', '.join(sorted(members))}:\n  " + "\n  ".join(ties))
    return problems


def test_every_module_is_in_a_room():
    rooms = {name for names in ROOMS for name in names}
    assert not {room_of(name) for name in module_files(REPO)} - rooms, (
        "a new room: add it to ROOMS here and to docs/design.md's Layout"
    )


def test_imports_only_point_down():
    upward = upward_imports(all_imports(REPO), REPO)
    assert not upward, "\n".join(upward)


def test_no_import_cycle_between_files():
    cycles = file_cycles(all_imports(REPO), REPO, PENDING_CYCLES)
    assert not cycles, "\n".join(cycles)


def test_the_design_notes_list_the_rooms_in_this_order():
    text = (REPO / "docs" / "design.md").read_text()
    block = text.split("## Layout", 1)[1].split("```", 2)[1]
    listed = []
    for match in re.finditer(r"^  ([\w./]+(?:, [\w./]+)*)\s{2,}", block, re.MULTILINE):
        for entry in match.group(1).split(", "):
            stem = entry.removesuffix("/").removesuffix(".py")
            listed.append("relm" if stem == "__init__" else stem)
    assert listed == [name for names in ROOMS for name in names]


def test_the_checks_catch_an_upward_import_and_a_cycle(tmp_path):
    files = {
        "relm/__init__.py": "",
        "relm/config/__init__.py": "",
        "relm/config/schema.py": "def f():\n    from relm.trainer import loop\n",
        "relm/trainer/__init__.py": "",
        "relm/trainer/loop.py": "import importlib\n\nimportlib.import_module('relm.trainer.steps')\n",
        "relm/trainer/steps.py": "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from . import loop\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    imports = all_imports(tmp_path)

    upward = upward_imports(imports, tmp_path)
    assert len(upward) == 1
    assert upward[0].startswith("relm/config/schema.py:2 imports relm.trainer.loop: room `trainer`")
    cycles = file_cycles(imports, tmp_path, allowed=set())
    assert cycles == [
        "import cycle between relm.trainer.loop, relm.trainer.steps:\n"
        "  relm/trainer/loop.py:3 imports relm.trainer.steps\n"
        "  relm/trainer/steps.py:4 imports relm.trainer.loop"
    ]
    assert not file_cycles(
        imports, tmp_path, allowed={frozenset({"relm.trainer.loop", "relm.trainer.steps"})}
    )


def test_a_cycle_through_a_packages_init_is_caught(tmp_path):
    # Importing relm.rewards.manager runs relm/rewards/__init__.py first, which imports the registry,
    # which imports the file that asked for the manager: a cycle no single import line shows.
    files = {
        "relm/__init__.py": "",
        "relm/data/__init__.py": "",
        "relm/data/tasks.py": "",
        "relm/rewards/__init__.py": "from relm.rewards.registry import score\n",
        "relm/rewards/registry.py": "from relm.data.tasks import TASKS\n",
        "relm/rewards/manager.py": "",
        "relm/trainer/__init__.py": "",
        "relm/trainer/loop.py": "from relm.rewards.manager import Manager\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert not file_cycles(all_imports(tmp_path), tmp_path, allowed=set())

    (tmp_path / "relm/data/tasks.py").write_text(
        "def tasks():\n    from relm.rewards.manager import Manager\n"
    )
    imports = all_imports(tmp_path)
    assert file_cycles(imports, tmp_path, allowed=set()) == [
        "import cycle between relm.data.tasks, relm.rewards, relm.rewards.registry:\n"
        "  relm/data/tasks.py:2 imports relm.rewards (its package's __init__ runs)\n"
        "  relm/rewards/__init__.py:1 imports relm.rewards.registry\n"
        "  relm/rewards/registry.py:1 imports relm.data.tasks"
    ]
    assert upward_imports(imports, tmp_path) == [
        "relm/data/tasks.py:2 imports relm.rewards.manager: room `rewards` is above `data` in "
        "docs/design.md's Layout; move what is shared down, or have the caller pass it in"
    ]
