"""k8s/: every overlay renders with Kustomize and validates against the Kubernetes schemas
(strict: a misspelt field fails), and the rendered objects keep the promises of the design.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from tests.deploy.tools import OVERLAYS, ROOT, k8s_copy_with_secrets, kustomize, run, tool

pytestmark = pytest.mark.deploy
COMPONENT_LINE = re.compile(r"^(\s*)# - (\.\./\S+)$", re.M)  # an optional component, commented out


@pytest.fixture(scope="module")
def k8s_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return k8s_copy_with_secrets(tmp_path_factory.mktemp("k8s"))


@pytest.fixture(scope="module")
def rendered(k8s_dir: Path) -> dict[str, list[dict]]:
    return {overlay: kustomize(k8s_dir / "overlays" / overlay) for overlay in OVERLAYS}


def by_kind(docs: list[dict], kind: str) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def workloads(docs: list[dict]) -> list[dict]:
    return [d for d in docs if d["kind"] in ("Deployment", "StatefulSet", "Job")]


def _validate(path: Path) -> None:
    proc = run([tool("kubernetes-validate"), "--strict", "--quiet", str(path)])
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_renders_and_validates_strictly(overlay: str, k8s_dir: Path, tmp_path: Path) -> None:
    proc = run([tool("kubectl"), "kustomize", str(k8s_dir / "overlays" / overlay)])
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / f"{overlay}.yaml"
    out.write_text(proc.stdout)
    _validate(out)


def optional_components(overlay: str) -> list[str]:
    """The components an overlay lists commented out: what k8s/README.md tells a user to uncomment."""
    text = (ROOT / "k8s" / "overlays" / overlay / "kustomization.yaml").read_text()
    return [m.group(2) for m in COMPONENT_LINE.finditer(text)]


def render_with(tmp_path: Path, overlay: str, *components: str) -> list[dict]:
    """The overlay with ``components`` uncommented in its own kustomization.yaml, as the docs tell a user to add
    them (no test-only overlay): rendered and strictly validated."""
    path = k8s_copy_with_secrets(tmp_path) / "overlays" / overlay / "kustomization.yaml"
    text = path.read_text()
    for component in components:
        text, n = re.subn(rf"^(\s*)# - ({re.escape(component)})$", r"\1- \2", text, flags=re.M)
        assert n == 1, f"k8s/overlays/{overlay} does not list {component} as an optional component"
    path.write_text(text)
    proc = run([tool("kubectl"), "kustomize", str(path.parent)])
    assert proc.returncode == 0, f"{overlay} + {components}: {proc.stderr}"
    out = tmp_path / "rendered.yaml"
    out.write_text(proc.stdout)
    _validate(out)
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


MULTI_GPU, MULTI_NODE = "../../components/trainer-multi-gpu", "../../components/trainer-multi-node"
AUTOSCALER, MONITORING = "../../components/searcher-autoscaler", "../../../monitoring"
OPENENV = "../../components/openenv-server"
# Every combination the docs describe: each optional component alone, and one trainer layout with the rest.
DOCUMENTED = [
    *[("gpu", (c,)) for c in (MULTI_GPU, MULTI_NODE, AUTOSCALER, OPENENV, MONITORING)],
    ("gpu", (MULTI_GPU, AUTOSCALER, OPENENV, MONITORING)),
    ("gpu", (MULTI_NODE, AUTOSCALER, OPENENV, MONITORING)),
    *[("cpu-dev", (c,)) for c in (AUTOSCALER, OPENENV, MONITORING)],
    ("cpu-dev", (AUTOSCALER, OPENENV, MONITORING)),
]


def test_the_overlays_offer_the_documented_components() -> None:
    assert optional_components("gpu") == [MULTI_GPU, MULTI_NODE, AUTOSCALER, OPENENV, MONITORING]
    assert optional_components("cpu-dev") == [AUTOSCALER, OPENENV, MONITORING]
    readme = (ROOT / "k8s" / "README.md").read_text()
    for component in (MULTI_GPU, MULTI_NODE, AUTOSCALER, OPENENV, MONITORING):
        assert component.rsplit("/", 1)[1] in readme


@pytest.mark.parametrize(
    ("overlay", "components"),
    DOCUMENTED,
    ids=lambda v: v if isinstance(v, str) else "+".join(c.rsplit("/", 1)[1] for c in v),
)
def test_every_documented_combination_renders_with_its_gpus_and_replicas(
    overlay: str, components: tuple[str, ...], tmp_path: Path
) -> None:
    docs = render_with(tmp_path, overlay, *components)
    deployments = by_kind(docs, "Deployment")
    searcher = _container(deployments["searcher"], "searcher")
    if overlay == "gpu":
        assert searcher["resources"]["limits"]["nvidia.com/gpu"] == 1
        assert deployments["searcher"]["spec"]["replicas"] == 3
    else:
        assert "nvidia.com/gpu" not in str(docs)
        assert deployments["searcher"]["spec"]["replicas"] == 2
    if MULTI_NODE in components:
        assert "trainer" not in deployments and by_kind(docs, "Job")["trainer"]
    else:
        trainer = _container(deployments["trainer"], "trainer")
        procs = int({e["name"]: e.get("value") for e in trainer.get("env", [])}.get("TBA_TRAINER_PROCS", 1))
        assert procs == (4 if MULTI_GPU in components else 1)
        if overlay == "gpu":
            assert trainer["resources"]["limits"]["nvidia.com/gpu"] == procs
    assert ("HorizontalPodAutoscaler" in {d["kind"] for d in docs}) == (AUTOSCALER in components)


def test_multi_gpu_trainer_component(tmp_path: Path) -> None:
    """One pod, N GPUs: `tba trainer` with TBA_TRAINER_PROCS=N runs itself as N ranks under torchrun."""
    trainer = by_kind(render_with(tmp_path, "gpu", MULTI_GPU), "Deployment")["trainer"]
    container = _container(trainer, "trainer")
    procs = {e["name"]: e.get("value") for e in container["env"]}["TBA_TRAINER_PROCS"]
    assert container["command"] == ["tba", "trainer"]
    assert int(procs) == container["resources"]["limits"]["nvidia.com/gpu"] > 1
    assert any(m["mountPath"] == "/dev/shm" for m in container["volumeMounts"])


def test_multi_node_trainer_component(tmp_path: Path) -> None:
    """Several nodes: an indexed Job whose pods meet at pod 0 through a headless Service, instead of the Deployment."""
    docs = render_with(tmp_path, "gpu", MULTI_NODE)
    assert "trainer" not in by_kind(docs, "Deployment")
    job = by_kind(docs, "Job")["trainer"]
    spec, pod = job["spec"], job["spec"]["template"]["spec"]
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"] >= 2
    headless = by_kind(docs, "Service")["trainer-nodes"]
    assert headless["spec"]["clusterIP"] == "None" and pod["subdomain"] == "trainer-nodes"
    container = _container(job, "trainer")
    env = {e["name"]: e.get("value") for e in container["env"]}
    command = container["command"][-1]
    assert '--node-rank "$JOB_COMPLETION_INDEX"' in command and "trainer-0.trainer-nodes" in command
    assert (
        int(env["NODES"]) == spec["completions"]
        and int(env["GPUS"]) == container["resources"]["limits"]["nvidia.com/gpu"]
    )
    assert "TBA_TRAINER_PROCS" not in env, "torchrun is started by the command: tba trainer must not start another"
    metrics = by_kind(docs, "Service")["trainer-metrics"]
    assert metrics["spec"]["selector"]["batch.kubernetes.io/job-completion-index"] == "0"
    assert pod["securityContext"]["runAsNonRoot"] is True


def test_autoscaler_component_and_its_metric_rule(tmp_path: Path) -> None:
    """The HPA scales the searcher Deployment on the external metric that the shipped prometheus-adapter rule
    serves, and the docs state the replica range it imposes over the overlay's count."""
    hpa = by_kind(render_with(tmp_path, "gpu", AUTOSCALER), "HorizontalPodAutoscaler")["searcher"]
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "searcher"}
    (metric,) = hpa["spec"]["metrics"]
    component = ROOT / "k8s" / "components" / "searcher-autoscaler"
    values = yaml.safe_load((component / "prometheus-adapter-values.yaml").read_text())
    (rule,) = values["rules"]["external"]
    assert rule["name"]["as"] == metric["external"]["metric"]["name"]
    assert rule["seriesQuery"].startswith("tba_trainer_wait_seconds_total")
    low, high = hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]
    for doc in (component / "kustomization.yaml", ROOT / "k8s" / "README.md"):
        assert f"minReplicas ({low})" in doc.read_text() and f"maxReplicas ({high})" in doc.read_text(), doc


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_openenv_server_component(overlay: str, tmp_path: Path) -> None:
    """The calculator served over OpenEnv in the cluster: its own unprivileged, probed Deployment behind a Service
    only the searchers may reach, and the run's settings an openenv task against it with the served task's
    limits, from the served task's base model."""
    from tba.tasks import make_task

    docs = render_with(tmp_path, overlay, OPENENV)
    server = _container(by_kind(docs, "Deployment")["envserver"], "envserver")
    assert server["image"].startswith("tba/envserver:") and server["command"][:4] == [
        "tba",
        "envserver",
        "--task",
        "calculator",
    ]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert server[probe]["httpGet"] == {"path": "/health", "port": "http"}, probe
    assert "nvidia.com/gpu" not in str(server["resources"])
    (port,) = by_kind(docs, "Service")["envserver"]["spec"]["ports"]
    assert port["port"] == 8010
    (rule,) = by_kind(docs, "NetworkPolicy")["envserver-from-searchers"]["spec"]["ingress"]
    assert rule["from"] == [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "searcher"}}}]
    (settings,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("tba-settings")]
    assert settings["data"]["TBA_TASK"] == "openenv"
    options = json.loads(settings["data"]["TBA_TASK_OPTIONS"])
    calculator = make_task("calculator")
    assert options["url"] == "http://envserver:8010" and options["max_turns"] == calculator.max_turns
    assert options["max_episode_tokens"] == calculator.max_episode_tokens
    assert options["turn_stop"] == list(calculator.turn_stop)
    assert make_task("openenv", options).url == options["url"]
    model_init = _container(by_kind(docs, "Job")["model-init"], "model-init")
    assert {"name": "TBA_TASK", "value": "calculator"} in model_init["env"]


def test_a_misspelt_field_is_caught(k8s_dir: Path, tmp_path: Path) -> None:
    """The validation is strict for real: the same manifests with one typo fail."""
    bad = tmp_path / "bad.yaml"
    text = run([tool("kubectl"), "kustomize", str(k8s_dir / "overlays" / "cpu-dev")]).stdout
    bad.write_text(text.replace("readinessProbe:", "readinesProbe:", 1))
    proc = run([tool("kubernetes-validate"), "--strict", "--quiet", str(bad)])
    assert proc.returncode != 0


def test_secrets_are_not_committed() -> None:
    for overlay in OVERLAYS:
        assert not (ROOT / "k8s" / "overlays" / overlay / "secrets.env").exists() or _ignored(overlay)
        example = (ROOT / "k8s" / "overlays" / overlay / "secrets.env.example").read_text()
        values = [line.split("=", 1)[1] for line in example.splitlines() if "=" in line and not line.startswith("#")]
        assert values and all(v == "" for v in values), "secrets.env.example must not carry values"


def _ignored(overlay: str) -> bool:
    proc = run(["git", "check-ignore", "-q", f"k8s/overlays/{overlay}/secrets.env"])
    return proc.returncode == 0


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_container_runs_as_non_root_on_a_read_only_root(overlay: str, rendered: dict) -> None:
    for workload in workloads(rendered[overlay]):
        pod = workload["spec"]["template"]["spec"]
        for c in pod.get("initContainers", []) + pod["containers"]:
            ctx = {**pod.get("securityContext", {}), **c.get("securityContext", {})}
            where = f"{overlay}: {workload['metadata']['name']}/{c['name']}"
            assert ctx.get("runAsNonRoot") is True, where
            assert c.get("securityContext", {}).get("readOnlyRootFilesystem") is True, where
            assert ctx.get("allowPrivilegeEscalation") is False, where


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_trainer_is_a_single_recreated_replica(overlay: str, rendered: dict) -> None:
    trainer = by_kind(rendered[overlay], "Deployment")["trainer"]
    assert trainer["spec"]["replicas"] == 1
    assert trainer["spec"]["strategy"] == {"type": "Recreate"}


def test_buffer_runs_several_replicas_and_searchers_scale_alone(rendered: dict) -> None:
    gpu = by_kind(rendered["gpu"], "Deployment")
    assert gpu["buffer"]["spec"]["replicas"] >= 2
    assert gpu["searcher"]["spec"]["replicas"] == 3
    assert by_kind(rendered["cpu-dev"], "Deployment")["searcher"]["spec"]["replicas"] == 2
    assert "buffer" in by_kind(rendered["gpu"], "Service")


def _container(workload: dict, name: str) -> dict:
    return next(c for c in workload["spec"]["template"]["spec"]["containers"] if c["name"] == name)


def test_gpu_overlay_puts_trainer_and_searchers_on_gpu_nodes(rendered: dict) -> None:
    deployments = by_kind(rendered["gpu"], "Deployment")
    for name in ("trainer", "searcher"):
        spec = deployments[name]["spec"]["template"]["spec"]
        assert _container(deployments[name], name)["resources"]["limits"]["nvidia.com/gpu"] == 1
        assert any(t["key"] == "nvidia.com/gpu" for t in spec["tolerations"])
        assert spec["nodeSelector"]
    assert "nvidia.com/gpu" not in str(deployments["buffer"])
    assert "nvidia.com/gpu" not in str(by_kind(rendered["cpu-dev"], "Deployment"))


def test_cpu_dev_uses_the_cpu_images(rendered: dict) -> None:
    deployments = by_kind(rendered["cpu-dev"], "Deployment")
    assert _container(deployments["searcher"], "searcher")["image"] == "tba/searcher:latest-cpu"
    assert _container(deployments["trainer"], "trainer")["image"] == "tba/trainer:latest-cpu"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_checkpoints_shared_and_read_only_for_searchers(overlay: str, rendered: dict) -> None:
    docs = rendered[overlay]
    pvcs = by_kind(docs, "PersistentVolumeClaim")
    expected = ["ReadWriteMany"] if overlay == "gpu" else ["ReadWriteOnce"]
    assert pvcs["checkpoints"]["spec"]["accessModes"] == expected
    deployments = by_kind(docs, "Deployment")
    mounts = {m["name"]: m for m in _container(deployments["searcher"], "searcher")["volumeMounts"]}
    assert mounts["checkpoints"]["readOnly"] is True and mounts["models"]["readOnly"] is True
    mounts = {m["name"]: m for m in _container(deployments["trainer"], "trainer")["volumeMounts"]}
    assert not mounts["checkpoints"].get("readOnly")
    assert by_kind(docs, "StatefulSet")["redis"]["spec"]["volumeClaimTemplates"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_pod_runs_unprivileged(overlay: str, rendered: dict) -> None:
    for w in workloads(rendered[overlay]):
        pod = w["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True, w["metadata"]["name"]
        assert pod["securityContext"]["runAsUser"] != 0
        for c in pod.get("initContainers", []) + pod["containers"]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False, c["name"]
            assert sc["capabilities"]["drop"] == ["ALL"], c["name"]
            assert sc["readOnlyRootFilesystem"] is True, c["name"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_long_running_container_has_probes(overlay: str, rendered: dict) -> None:
    for w in workloads(rendered[overlay]):
        if w["kind"] == "Job":
            continue
        for c in w["spec"]["template"]["spec"]["containers"]:
            assert "livenessProbe" in c, f"{w['metadata']['name']}/{c['name']}"
            assert "readinessProbe" in c or "startupProbe" in c, f"{w['metadata']['name']}/{c['name']}"


def test_network_policies_let_only_the_services_in(rendered: dict) -> None:
    policies = by_kind(rendered["gpu"], "NetworkPolicy")
    assert policies["default-deny-ingress"]["spec"] == {"podSelector": {}, "policyTypes": ["Ingress"]}

    def allowed(policy: str) -> set[str]:
        (rule,) = policies[policy]["spec"]["ingress"]
        (peer,) = rule["from"]
        (expr,) = peer["podSelector"]["matchExpressions"]
        assert expr["key"] == "app.kubernetes.io/name" and expr["operator"] == "In"
        return set(expr["values"])

    assert allowed("redis-from-services") == {"buffer", "trainer", "searcher"}
    assert allowed("buffer-from-services") == {"trainer", "searcher"}
    labels = {
        w["metadata"]["name"]: w["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"]
        for w in workloads(rendered["gpu"])
    }
    assert {"buffer", "trainer", "searcher", "redis"} <= set(labels.values())


def test_secrets_reach_every_service_from_the_secret(rendered: dict) -> None:
    docs = rendered["gpu"]
    (secret,) = by_kind(docs, "Secret").values()
    assert secret["metadata"]["name"].startswith("tba-secrets")
    for w in workloads(docs):
        for c in w["spec"]["template"]["spec"]["containers"]:
            env = {e["name"]: e for e in c.get("env", [])}
            if "TBA_REDIS_URL" in env:
                ref = env["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"]
                assert ref["name"] == secret["metadata"]["name"]
                assert env["TBA_REDIS_URL"]["value"] == "redis://:$(REDIS_PASSWORD)@redis:6379/0"
                assert env["TBA_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == secret["metadata"]["name"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_settings_config_map_is_referenced_by_its_generated_name(overlay: str, rendered: dict) -> None:
    (config_map,) = by_kind(rendered[overlay], "ConfigMap").values()
    for w in workloads(rendered[overlay]):
        if w["kind"] == "StatefulSet":
            continue
        (ref,) = _container(w, w["metadata"]["name"])["envFrom"]
        assert ref["configMapRef"]["name"] == config_map["metadata"]["name"]


def test_monitoring_component_ships_the_dashboard_and_marks_every_service_for_scraping(tmp_path: Path) -> None:
    docs = render_with(tmp_path, "gpu", MONITORING)
    dashboard = by_kind(docs, "ConfigMap")["tba-grafana-dashboard"]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dashboard["metadata"]["namespace"] == "monitoring"  # where the network policy lets Prometheus in
    assert dashboard["data"]["tba-dashboard.json"] == (ROOT / "monitoring/grafana/tba-dashboard.json").read_text()
    deployments = by_kind(docs, "Deployment")
    ports = {
        name: deployments[name]["spec"]["template"]["metadata"]["annotations"]
        for name in ("buffer", "trainer", "searcher")
    }
    assert {name: (a["prometheus.io/scrape"], a["prometheus.io/port"]) for name, a in ports.items()} == {
        "buffer": ("true", "8400"),
        "trainer": ("true", "9400"),
        "searcher": ("true", "9400"),
    }
