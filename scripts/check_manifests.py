"""Render the Kubernetes manifests and check them without a cluster (``make deploy-check``).

Each overlay of deploy/kubernetes/overlays is rendered with ``kubectl kustomize``, alone and with every
optional component of deploy/kubernetes/components, and each rendering is

- validated against the Kubernetes API's schemas with ``kubernetes-validate --strict`` (a field the API
  does not know is an error), for the oldest and the newest Kubernetes version the manifests are meant
  for; custom resources (the ServiceMonitor) have no schema there and are named as such;
- scanned with ``checkov``: no failed check, and every skipped one carries its reason in the manifest
  (``checkov.io/skipN: CKV_K8S_xx=reason``).

Both tools first run on a manifest with known faults, which they must reject: a tool that checks nothing
cannot pass. Run with the Python of .venv-deploy, the tools' own environment (their dependencies would
conflict with the service's); the rendered manifests are written to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KUSTOMIZE = ROOT / "deploy" / "kubernetes"
KUBERNETES_VERSIONS = ("1.30.0", "1.37.0")  # topologySpreadConstraints' matchLabelKeys: beta from 1.27, GA 1.30
CUSTOM_RESOURCES = {"ServiceMonitor"}  # kinds with no schema in kubernetes-validate: checked by checkov only

FAULTY = """\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: faulty
spec:
  replicas: 1
  selector:
    matchLabels: {app: faulty}
  template:
    metadata:
      labels: {app: faulty}
    spec:
      containers:
        - name: faulty
          image: faulty:latest
          notAField: true
          securityContext:
            privileged: true
"""


def tool(name: str) -> str:
    """A command from this Python's environment (.venv-deploy/bin), else from PATH."""
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if not found:
        sys.exit(f"{name} not found: make deploy-check installs it")
    return found


def render(overlay: Path, components: list[Path], workdir: Path) -> str:
    """``kubectl kustomize`` of an overlay, with components added the way a user's kustomization adds them."""
    if not components:
        return run([tool("kubectl"), "kustomize", str(overlay)]).stdout
    top = Path(tempfile.mkdtemp(dir=workdir))
    lines = [
        "apiVersion: kustomize.config.k8s.io/v1beta1",
        "kind: Kustomization",
        "resources:",
        f"  - {os.path.relpath(overlay, top)}",  # kustomize takes relative paths only
        "components:",
        *(f"  - {os.path.relpath(component, top)}" for component in components),
    ]
    (top / "kustomization.yaml").write_text("\n".join(lines) + "\n")
    return run([tool("kubectl"), "kustomize", str(top)]).stdout


def run(command: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(command, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if check and result.returncode != 0:
        sys.exit(f"{' '.join(command)} failed ({result.returncode}):\n{result.stdout}{result.stderr}")
    return result


def validate(path: Path) -> list[str]:
    """kubernetes-validate --strict for each version; the problems found (none: valid)."""
    problems = []
    for version in KUBERNETES_VERSIONS:
        result = run([tool("kubernetes-validate"), "--strict", "-k", version, str(path)], check=False)
        output = result.stdout + result.stderr
        if result.returncode != 0:
            problems.append(f"kubernetes-validate {version}: {output.strip()}")
        for line in output.splitlines():
            if "Couldn't find schema" in line and not any(f"kind {kind} " in line for kind in CUSTOM_RESOURCES):
                problems.append(f"kubernetes-validate {version}: {line}")
    return problems


def scan(path: Path) -> tuple[dict[str, int], list[str]]:
    """checkov on one rendering: its summary, and the problems (failed checks, skips without a reason)."""
    result = run(
        [tool("checkov"), "--framework", "kubernetes", "-f", str(path), "--skip-download", "--quiet", "-o", "json"],
        check=False,
    )
    try:
        report = json.loads(result.stdout)
    except json.JSONDecodeError:
        return {}, [f"checkov gave no report ({result.returncode}): {result.stdout[-2000:]}{result.stderr[-2000:]}"]
    if isinstance(report, list):  # one report per framework
        report = next(r for r in report if r.get("check_type") == "kubernetes")
    summary = report["summary"]
    problems = [
        f"checkov {c['check_id']} failed on {c['resource']}: {c['check_name']}"
        for c in report["results"].get("failed_checks", [])
    ]
    for skipped in report["results"].get("skipped_checks", []):
        reason = (skipped.get("check_result") or {}).get("suppress_comment", "").strip()
        if not reason or reason.lower() == "no comment provided":
            problems.append(f"checkov {skipped['check_id']} skipped on {skipped['resource']} without a reason")
    if summary["passed"] == 0:
        problems.append("checkov passed no check: it did not read the manifests")
    return summary, problems


def unchecked(kinds: list[str]) -> str:
    custom = [kind for kind in kinds if kind in CUSTOM_RESOURCES]
    return f" ({', '.join(custom)}: custom resource, no schema)" if custom else ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "manifests", help="where the renderings go")
    out: Path = parser.parse_args().out
    out.mkdir(parents=True, exist_ok=True)

    faulty = out / "faulty.yaml"
    faulty.write_text(FAULTY)
    if not validate(faulty):
        sys.exit("kubernetes-validate accepted a manifest with an unknown field: it checks nothing")
    if not scan(faulty)[1]:
        sys.exit("checkov found nothing in a privileged container with a latest tag: it checks nothing")
    faulty.unlink()

    components = sorted(p for p in (KUSTOMIZE / "components").iterdir() if (p / "kustomization.yaml").is_file())
    overlays = sorted(p for p in (KUSTOMIZE / "overlays").iterdir() if (p / "kustomization.yaml").is_file())
    failed = False
    with tempfile.TemporaryDirectory() as workdir:
        for overlay in overlays:
            for name, parts in ((overlay.name, []), (f"{overlay.name}+components", components)):
                path = out / f"{name}.yaml"
                path.write_text(render(overlay, parts, Path(workdir)))
                invalid = validate(path)
                summary, flagged = scan(path)
                problems = invalid + flagged
                lines = path.read_text().splitlines()
                kinds = sorted({line.split(":", 1)[1].strip() for line in lines if line.startswith("kind:")})
                print(
                    f"{name}: {', '.join(kinds)}; kubernetes-validate --strict "
                    f"{' and '.join(KUBERNETES_VERSIONS)}: {'invalid' if invalid else 'valid'}"
                    f"{unchecked(kinds)}; checkov: "
                    f"{summary.get('passed', 0)} passed, {summary.get('failed', 0)} failed, "
                    f"{summary.get('skipped', 0)} skipped with their reasons"
                )
                for problem in problems:
                    print(f"  {problem}")
                failed = failed or bool(problems)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
