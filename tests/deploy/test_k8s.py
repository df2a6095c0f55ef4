"""k8s/: every overlay renders with Kustomize and validates against the Kubernetes schemas
(strict: a misspelt field fails), and the rendered objects keep the promises of the design.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.deploy.tools import OVERLAYS, ROOT, k8s_copy_with_secrets, kustomize, run, tool

pytestmark = pytest.mark.deploy


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


def gpu_with_component(k8s_dir: Path, tmp_path: Path, name: str, component: str) -> list[dict]:
    """The gpu overlay with one optional component added, as a user adds it: rendered, strictly validated."""
    overlay = k8s_dir / "overlays" / f"gpu-{name}"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources: [../gpu]\ncomponents: [{component}]\n"
    )
    out = tmp_path / f"{name}.yaml"
    out.write_text(run([tool("kubectl"), "kustomize", str(overlay)]).stdout)
    _validate(out)
    return kustomize(overlay)


def test_autoscaler_component_renders_and_validates(k8s_dir: Path, tmp_path: Path) -> None:
    docs = gpu_with_component(k8s_dir, tmp_path, "autoscaled", "../../components/searcher-autoscaler")
    hpa = by_kind(docs, "HorizontalPodAutoscaler")["searcher"]
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "searcher"}


def _with_components(k8s_dir: Path, name: str, *components: str) -> Path:
    overlay = k8s_dir / "overlays" / name
    overlay.mkdir(exist_ok=True)
    listed = ", ".join(f"../../components/{c}" for c in components)
    (overlay / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources: [../gpu]\ncomponents: [{listed}]\n"
    )
    return overlay


def test_multi_gpu_trainer_component_renders_and_validates(k8s_dir: Path, tmp_path: Path) -> None:
    """One pod, N GPUs: `tba trainer` with TBA_TRAINER_PROCS=N runs itself as N ranks under torchrun."""
    overlay = _with_components(k8s_dir, "gpu-multi-gpu", "trainer-multi-gpu")
    trainer = by_kind(kustomize(overlay), "Deployment")["trainer"]
    container = _container(trainer, "trainer")
    procs = {e["name"]: e.get("value") for e in container["env"]}["TBA_TRAINER_PROCS"]
    assert container["command"] == ["tba", "trainer"]
    assert int(procs) == container["resources"]["limits"]["nvidia.com/gpu"] > 1
    assert any(m["mountPath"] == "/dev/shm" for m in container["volumeMounts"])
    out = tmp_path / "multi-gpu.yaml"
    out.write_text(run([tool("kubectl"), "kustomize", str(overlay)]).stdout)
    _validate(out)


def test_multi_node_trainer_recipe_renders_and_validates(k8s_dir: Path, tmp_path: Path) -> None:
    """Several nodes: an indexed Job whose pods meet at pod 0 through a headless Service, instead of the Deployment."""
    overlay = _with_components(k8s_dir, "gpu-multi-node", "trainer-multi-node")
    docs = kustomize(overlay)
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
    out = tmp_path / "multi-node.yaml"
    out.write_text(run([tool("kubectl"), "kustomize", str(overlay)]).stdout)
    _validate(out)


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


def test_monitoring_component_ships_the_dashboard_and_marks_every_service_for_scraping(
    k8s_dir: Path, tmp_path: Path
) -> None:
    docs = gpu_with_component(k8s_dir, tmp_path, "monitored", "../../../monitoring")
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
