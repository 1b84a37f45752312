"""The deployment files agree with the service and with each other: Kubernetes manifests rendered with
``kubectl kustomize``, the nginx configuration and its compose file. (Schemas and security checks of the
manifests: ``make deploy-check``.)"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.main import create_app
from app.metrics import Metrics
from app.settings import Settings
from tests.helpers import ROOT

KUSTOMIZE = ROOT / "deploy" / "kubernetes"
NGINX_DIR = ROOT / "deploy" / "nginx"
DOCKERFILE = (ROOT / "Dockerfile").read_text()
ENCODER_CONF = (NGINX_DIR / "encoder.conf").read_text()


def kubectl() -> str:
    found = os.environ.get("KUBECTL") or shutil.which("kubectl")
    assert found, "kubectl is missing: make test installs it with apt"
    return found


def render(overlay: str, components: tuple[str, ...] = (), workdir: Path | None = None) -> list[dict[str, Any]]:
    target = KUSTOMIZE / "overlays" / overlay
    if components:
        assert workdir is not None
        paths = [os.path.relpath(KUSTOMIZE / "components" / c, workdir) for c in components]
        (workdir / "kustomization.yaml").write_text(
            yaml.safe_dump({"resources": [os.path.relpath(target, workdir)], "components": paths})
        )
        target = workdir
    result = subprocess.run([kubectl(), "kustomize", str(target)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return list(yaml.safe_load_all(result.stdout))


def one(resources: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [r for r in resources if r["kind"] == kind]
    assert len(found) == 1, (kind, [r["kind"] for r in resources])
    return found[0]


@pytest.fixture(scope="module", params=["cpu", "gpu"])
def rendered(request: pytest.FixtureRequest) -> tuple[str, list[dict[str, Any]]]:
    return request.param, render(request.param)


def settings_of(resources: list[dict[str, Any]]) -> dict[str, str]:
    return one(resources, "ConfigMap")["data"]


def container_of(resources: list[dict[str, Any]]) -> dict[str, Any]:
    (container,) = one(resources, "Deployment")["spec"]["template"]["spec"]["containers"]
    return container


def seconds(value: str) -> float:
    """An nginx time (``75s``, ``2m``) in seconds."""
    match = re.fullmatch(r"(\d+)(ms|s|m)?", value)
    assert match, value
    return int(match.group(1)) * {"ms": 0.001, "s": 1, "m": 60, None: 1}[match.group(2)]


def nginx_directive(name: str, text: str = ENCODER_CONF) -> list[str]:
    return re.findall(rf"^\s*{name}\s+([^;]+);", text, re.M)


# ---- Kubernetes ----


def test_settings_are_settings_the_service_knows_with_valid_values(
    rendered: tuple[str, list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, resources = rendered
    data = settings_of(resources)
    fields = set(Settings.model_fields)
    for key, value in data.items():
        if key.startswith("ENCODER_"):
            assert key.removeprefix("ENCODER_").lower() in fields, f"{key} is not a setting of app/settings.py"
            monkeypatch.setenv(key, value)
    Settings()  # the values validate


def test_pod_is_locked_down_and_probed_on_health(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    _, resources = rendered
    deployment = one(resources, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    container = container_of(resources)
    assert deployment["spec"]["replicas"] >= 2
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001 and re.search(r"^USER 10001", DOCKERFILE, re.M)
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True and security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    # A read-only root: /tmp is a writable volume.
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    assert any(v["name"] == "tmp" and "emptyDir" in v for v in pod["volumes"])
    # The image's port, probed on /health.
    assert container["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]
    assert "UVICORN_PORT=8000" in DOCKERFILE
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/health", "port": "http"}, probe
    assert {c["topologyKey"] for c in pod["topologySpreadConstraints"]} == {
        "kubernetes.io/hostname",
        "topology.kubernetes.io/zone",
    }
    # Requests equal limits (Guaranteed QoS), and torch's threads match the CPU limit.
    assert container["resources"]["requests"] == container["resources"]["limits"]
    assert settings_of(resources)["OMP_NUM_THREADS"] == container["resources"]["limits"]["cpu"]


def test_grace_period_covers_the_pause_and_the_longest_request(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    _, resources = rendered
    pod = one(resources, "Deployment")["spec"]["template"]["spec"]
    command = container_of(resources)["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep"
    pause = float(command[1])
    timeout = float(settings_of(resources)["ENCODER_REQUEST_TIMEOUT_S"])
    assert pause >= 5
    # SIGTERM comes after the pause; uvicorn then answers what it admitted, each within the request timeout.
    assert pod["terminationGracePeriodSeconds"] >= pause + timeout + 5


def test_settings_and_keys_come_from_the_configmap_and_the_secret(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    _, resources = rendered
    container = container_of(resources)
    configmap = one(resources, "ConfigMap")["metadata"]["name"]
    assert container["envFrom"] == [{"configMapRef": {"name": configmap}}]  # the generated, hashed name
    (keys,) = [e for e in container["env"] if e["name"] == "ENCODER_API_KEYS"]
    assert keys["valueFrom"] == {"secretKeyRef": {"name": "encoder-api-keys", "key": "keys"}}
    assert not any(r["kind"] == "Secret" for r in resources), "no key belongs in the repository"


def test_service_hpa_pdb_and_network_policy_select_the_pods(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    _, resources = rendered
    deployment = one(resources, "Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    service = one(resources, "Service")
    assert service["spec"]["selector"].items() <= labels.items()
    assert service["spec"]["ports"][0]["targetPort"] == "http"
    assert one(resources, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"].items() <= labels.items()
    policy = one(resources, "NetworkPolicy")["spec"]
    assert policy["podSelector"]["matchLabels"].items() <= labels.items()
    assert policy["ingress"] == [{"ports": [{"port": "http", "protocol": "TCP"}]}]
    assert policy["egress"] == [] and "Egress" in policy["policyTypes"]
    hpa = one(resources, "HorizontalPodAutoscaler")["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "encoder-service"}
    assert hpa["minReplicas"] >= 2 and hpa["maxReplicas"] > hpa["minReplicas"]
    assert hpa["metrics"][0]["resource"]["name"] == "cpu"
    namespaces = {r["metadata"].get("namespace") for r in resources if r["kind"] != "Namespace"}
    assert namespaces == {one(resources, "Namespace")["metadata"]["name"]}


def test_gpu_overlay_asks_for_one_gpu_and_runs_the_cuda_image() -> None:
    cpu, gpu = render("cpu"), render("gpu")
    assert container_of(cpu)["image"] == "encoder-service:cpu"
    assert settings_of(cpu)["ENCODER_DEVICE"] == "cpu"
    assert "nvidia.com/gpu" not in container_of(cpu)["resources"]["limits"]
    container = container_of(gpu)
    assert container["image"] == "encoder-service:cuda"  # docker build --build-arg TORCH_INDEX=cu128
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert settings_of(gpu)["ENCODER_DEVICE"] == "cuda" and settings_of(gpu)["ENCODER_DTYPE"] == "float16"
    pod = one(gpu, "Deployment")["spec"]["template"]["spec"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert pod["nodeSelector"]
    assert "ARG TORCH_INDEX=cpu" in DOCKERFILE


def test_auto_runs_one_process_in_a_cpu_pod_and_front_ends_around_an_engine_in_a_gpu_pod() -> None:
    """ENCODER_WORKERS=auto reads the pod's CPU limit: the CPU overlay's cores make one process, the GPU overlay's
    several front ends; each front end has its share of the memory beside the engine's."""
    from app.serve import front_ends

    limits = {overlay: container_of(render(overlay))["resources"]["limits"] for overlay in ("cpu", "gpu")}
    assert front_ends("auto", int(limits["cpu"]["cpu"]), gpu=False) == 1
    gpu_front_ends = front_ends("auto", int(limits["gpu"]["cpu"]), gpu=True)
    assert gpu_front_ends == 4  # the count that served 32 clients x 1 text best on an H100 (docs/benchmarks/cuda.md)
    assert limits["gpu"]["memory"].endswith("Gi") and int(limits["gpu"]["memory"][:-2]) >= 4 + 0.2 * gpu_front_ends


def test_components_add_the_service_monitor_and_the_queue_metric(tmp_path: Path) -> None:
    resources = render("cpu", ("monitoring", "queue-autoscaling"), tmp_path)
    monitor = one(resources, "ServiceMonitor")
    service = one(resources, "Service")
    assert monitor["metadata"]["namespace"] == service["metadata"]["namespace"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]
    assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"
    metrics = one(resources, "HorizontalPodAutoscaler")["spec"]["metrics"]
    (queue,) = [m for m in metrics if m["type"] == "Pods"]
    # The metric the service exports, served to the HPA by the adapter's rule beside the component.
    name = queue["pods"]["metric"]["name"]
    assert name == "encoder_queue_texts"
    assert f"# TYPE {name} gauge" in Metrics().exposition().decode()
    values = yaml.safe_load(
        (KUSTOMIZE / "components" / "queue-autoscaling" / "prometheus-adapter-values.yaml").read_text()
    )
    (rule,) = values["rules"]["custom"]
    assert rule["name"]["as"] == name and name in rule["seriesQuery"]


# ---- nginx ----


def test_nginx_retries_exactly_the_services_post_endpoints() -> None:
    """Every POST endpoint of the service is an idempotent computation: each is in the location that sends
    a failed request on to the next replica. A new POST endpoint must be placed there (or not) on purpose."""
    paths = create_app(Settings()).openapi()["paths"]
    posts = {path for path, operations in paths.items() if "post" in operations}
    assert "/encode" in posts
    (location,) = re.findall(r"location ~ \^/\(([^)]+)\)\$ \{([^}]*)\}", ENCODER_CONF)
    tei = {path for path in posts if "tei" in path}  # text-embeddings-inference's, in a location of their own
    assert {f"/{path}" for path in location[0].split("|")} == posts - tei
    assert "proxy_next_upstream error timeout http_502 http_503 non_idempotent;" in location[1]
    (pattern, block) = re.findall(r"location ~ (\^/\(models[^ ]+) \{([^}]*)\}", ENCODER_CONF)[0]
    assert "proxy_next_upstream error timeout http_502 http_503 non_idempotent;" in block
    for path in tei:  # every TEI POST route, for the default model and a named one, and no other route
        assert re.match(pattern, path.replace("{model_name}", "minilm")), path
    assert not any(re.match(pattern, path) for path in posts - tei)
    assert not re.match(pattern, "/tei/info") and not re.match(pattern, "/models/minilm/tei/health")
    # Everywhere else (GET), the same retries but never for a request that may have had an effect.
    (default,) = nginx_directive("proxy_next_upstream")[:1]
    assert "non_idempotent" not in default


def test_nginx_limits_and_timeouts_agree_with_the_service() -> None:
    settings = Settings()
    (body,) = nginx_directive("client_max_body_size")
    assert body == f"{settings.max_body_bytes // 2**20}m" and settings.max_body_bytes % 2**20 == 0
    assert f"{settings.max_body_bytes:,} bytes" in ENCODER_CONF  # nginx's own 413 names the same limit
    (read,) = nginx_directive("proxy_read_timeout")
    assert seconds(read) > settings.request_timeout_s  # the service answers 503 timeout first
    # nginx closes idle upstream connections before uvicorn does (the image's keep-alive timeout).
    upstream = re.search(r"upstream encoder_replicas \{(.*?)\}", ENCODER_CONF, re.S)
    assert upstream is not None
    (idle,) = nginx_directive("keepalive_timeout", upstream.group(1))
    keep_alive = re.search(r"UVICORN_TIMEOUT_KEEP_ALIVE=(\d+)", DOCKERFILE)
    assert keep_alive is not None and seconds(idle) < int(keep_alive.group(1))
    assert re.search(r"^\s*include encoder-upstreams\.conf;", upstream.group(1), re.M)
    assert nginx_directive("keepalive", upstream.group(1)) and nginx_directive("zone", upstream.group(1))


def test_compose_runs_the_two_replicas_that_nginx_names() -> None:
    compose = yaml.safe_load((NGINX_DIR / "docker-compose.yml").read_text())
    services = compose["services"]
    upstreams = re.findall(r"^server (\S+):8000 (.*);$", (NGINX_DIR / "encoder-upstreams.conf").read_text(), re.M)
    assert [name for name, _ in upstreams] == ["encoder-a", "encoder-b"]
    for name, parameters in upstreams:
        assert "max_fails=" in parameters and "fail_timeout=" in parameters  # passive health checks
        replica = services[name]
        assert replica["build"]["context"] == "../.." and replica["image"] == "encoder-service:cpu"
        assert replica["read_only"] is True and "/tmp" in replica["tmpfs"]
        assert any("/health" in part for part in replica["healthcheck"]["test"])
        assert seconds(replica["stop_grace_period"]) > Settings().request_timeout_s
    nginx = services["nginx"]
    assert "./encoder.conf:/etc/nginx/conf.d/default.conf:ro" in nginx["volumes"]
    assert "./encoder-upstreams.conf:/etc/nginx/encoder-upstreams.conf:ro" in nginx["volumes"]
    assert any(port.endswith(":8080") for port in nginx["ports"]) and "listen 8080;" in ENCODER_CONF


def test_no_service_links_reach_the_pods(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    """The kubelet writes ENCODER_SERVICE_HOST and the like for a Service named encoder-service into every pod of its
    namespace unless told not to: variables with the service's own prefix that name no setting."""
    overlay, resources = rendered
    assert one(resources, "Deployment")["spec"]["template"]["spec"]["enableServiceLinks"] is False, overlay
