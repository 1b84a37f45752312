"""How the packages depend on each other: app/ reaches model/ through its package face alone, and model/ knows
nothing of app/ or HTTP; app/'s folders import only downwards."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def imported(package: str) -> dict[str, set[str]]:
    """The modules each file of ``package`` imports, by file."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module)
            elif isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
        found[str(path.relative_to(ROOT))] = names
    return found


def test_app_imports_model_through_its_package_face() -> None:
    inside = {f: sorted(m for m in names if m.startswith("model.")) for f, names in imported("app").items()}
    assert {f: modules for f, modules in inside.items() if modules} == {}
    assert any("model" in names for names in imported("app").values())  # it does import the package


# app/'s folders from the bottom up (docs/ARCHITECTURE.md, "The layout"): each imports only the folders below it
# and app/'s shared modules, which import no folder; main.py and serve.py, at the top, import any
FLOORS = ("engine", "serving", "services", "web", "api")
SHARED = {"errors", "metrics", "logs", "settings", "serialization", "schemas", "download", "allocator", "tracing"}


def test_apps_folders_import_only_downwards() -> None:
    folders = {path.name for path in (ROOT / "app").iterdir() if path.is_dir() and path.name != "__pycache__"}
    assert folders == {*FLOORS, "static"}
    wrong: dict[str, list[str]] = {}
    for file, names in imported("app").items():
        parts = Path(file).parts  # ("app", "engine", "worker.py") or ("app", "errors.py")
        if len(parts) == 2 and Path(file).stem not in SHARED:
            continue  # the top: main.py, serve.py, __init__.py
        allowed = SHARED if len(parts) == 2 else SHARED | set(FLOORS[: FLOORS.index(parts[1]) + 1])
        named = {module.split(".")[1] for module in names if module.startswith("app.")}
        if named - allowed:
            wrong[file] = sorted(named - allowed)
    assert wrong == {}


def test_each_api_dialect_is_a_folder_that_imports_no_other() -> None:
    """An API dialect (OpenAI's, TEI's, Cohere's, Jina's shapes) is one folder of app/api: its types, its translation
    to and from the services' data, its routes; it reaches the services directly, never through another dialect."""
    api = ROOT / "app" / "api"
    dialects = {path.name for path in api.iterdir() if path.is_dir() and path.name != "__pycache__"}
    assert dialects == {"openai", "tei", "cohere", "jina"}
    for dialect in dialects:
        assert {"types.py", "routes.py"} <= {path.name for path in (api / dialect).iterdir()}, dialect
    wrong: dict[str, list[str]] = {}
    for file, names in imported("app/api").items():
        parts = Path(file).parts  # ("app", "api", "tei", "routes.py") or ("app", "api", "hot.py")
        own = parts[2] if len(parts) > 3 else None
        others = {module.split(".")[2] for module in names if module.startswith("app.api.") and module.count(".") > 2}
        if own is not None and others - {own}:
            wrong[file] = sorted(others - {own})
    assert wrong == {}
    assert imported("app/api")["app/api/hot.py"] >= {"app.api.openai", "app.api.tei", "app.api.cohere"}


def test_the_engine_knows_nothing_of_http() -> None:
    """The engine raises its own errors (app/engine/errors.py); the web layer words them as HTTP's and gRPC's."""
    wrong = ("app.errors", "fastapi", "starlette", "uvicorn", "httpx", "grpc")
    found = {
        f: sorted(m for m in names if m.startswith(wrong))
        for f, names in imported("app").items()
        if Path(f).parts[1] == "engine"
    }
    assert {f: modules for f, modules in found.items() if modules} == {}
    assert len(found) >= 8  # every module of the engine was read


def test_model_knows_nothing_of_the_service() -> None:
    wrong = ("app", "fastapi", "starlette", "uvicorn", "pydantic", "httpx")
    found = {f: sorted(m for m in names if m.split(".")[0] in wrong) for f, names in imported("model").items()}
    assert {f: modules for f, modules in found.items() if modules} == {}


def test_models_folders_import_only_downwards() -> None:
    """model/spec imports nothing above it, and no torch when imported (a method may, where it computes with it);
    model/nn (the maths) nothing of model/runtime (loading, backends, the loaded model)."""
    folders = {path.name for path in (ROOT / "model").iterdir() if path.is_dir() and path.name != "__pycache__"}
    assert folders == {"spec", "nn", "runtime"}
    above = {"spec": ("model.nn", "model.runtime"), "nn": ("model.runtime",), "runtime": ()}
    wrong: dict[str, list[str]] = {}
    for file, names in imported("model").items():
        parts = Path(file).parts
        if len(parts) == 2:
            continue  # model/__init__.py, the package face
        bad = sorted(name for name in names if any(name == f or name.startswith(f + ".") for f in above[parts[1]]))
        if parts[1] == "spec":
            bad += sorted(name for name in on_import(ROOT / file) if name.split(".")[0] == "torch")
        if bad:
            wrong[file] = bad
    assert wrong == {}


def on_import(path: Path) -> set[str]:
    """The modules a file imports when it is imported: its module-level imports, not those of its functions nor
    those for the type checker alone."""
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def test_every_name_of_the_package_face_resolves_and_is_listed() -> None:
    """model/__init__ loads its names lazily: each one it lists is found in the module it names."""
    import model

    assert model.__all__ == list(model.WHERE)
    for name in model.__all__:
        assert getattr(model, name) is getattr(importlib.import_module(model.WHERE[name]), name), name


def test_the_type_checkers_imports_of_the_package_face_are_its_names() -> None:
    """The imports under TYPE_CHECKING in model/__init__ (what mypy sees) name the same names from the same modules
    as WHERE (what a running program gets): one list kept, the other checked against it."""
    import model

    tree = ast.parse(Path(model.__file__).read_text())
    (checking,) = [node for node in tree.body if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"]
    imported = {
        alias.name: node.module for node in checking.body if isinstance(node, ast.ImportFrom) for alias in node.names
    }
    assert imported == model.WHERE


def test_checkpoint_tensor_names_live_in_one_module() -> None:
    """Every string of model/ that names a checkpoint tensor (``….weight``, ``….bias``, a layer's ``{i}``, a head's
    part as the tables name it) is in model/spec/tensor_names.py; docstrings and comments aside."""
    from model.spec.tensor_names import HEAD_TENSORS, LM_HEAD, MASKED_LM_TENSORS

    parts = {name for table in (*HEAD_TENSORS.values(), *MASKED_LM_TENSORS.values()) for name in table.values()}
    assert {"classifier", "bert.pooler.dense", "cls.predictions.decoder", "vocab_projector"} <= parts
    found: dict[str, list[str]] = {}
    for path in sorted((ROOT / "model").rglob("*.py")):
        tree = ast.parse(path.read_text())
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef))
            and node.body
            and isinstance(node.body[0], ast.Expr)
        }
        names = [
            node.value
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docstrings
            and (node.value.endswith((".weight", ".bias")) or ".{i}." in node.value or node.value in {*parts, LM_HEAD})
        ]
        if names:
            found[path.name] = names
    assert set(found) == {"tensor_names.py"}, {name: values[:3] for name, values in found.items()}
    assert len(found["tensor_names.py"]) > 100
