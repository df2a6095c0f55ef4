"""docker-compose.yml and its override files, as Compose itself resolves them.

What a user relies on when they run `make up`: the GPU layout, the CPU
override, one searcher per GPU, volumes that keep searchers read-only, health-
gated start order, secrets that must come from the environment, loopback-only
ports.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.deploy.tools import COMPOSE_FILES, compose_binary, compose_config, compose_env, run

pytestmark = pytest.mark.deploy
LONG_RUNNING = ["redis", "buffer", "trainer", "searcher"]


@pytest.mark.parametrize("variant", sorted(COMPOSE_FILES))
def test_compose_config_is_valid(variant: str, tmp_path: Path) -> None:
    env, env_file = compose_env(tmp_path)
    files = [arg for f in COMPOSE_FILES[variant] for arg in ("-f", f)]
    proc = run([compose_binary(), "--env-file", str(env_file), *files, "config", "-q"], env=env)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("missing", ["REDIS_PASSWORD", "TBA_AUTH_TOKEN"])
def test_secrets_must_come_from_the_environment(missing: str, tmp_path: Path) -> None:
    env, env_file = compose_env(tmp_path)
    env_file.write_text(
        "".join(line + "\n" for line in env_file.read_text().splitlines() if not line.startswith(missing))
    )
    proc = run([compose_binary(), "--env-file", str(env_file), "config", "-q"], env=env)
    assert proc.returncode != 0
    assert missing in proc.stderr and ".env.example" in proc.stderr


def test_no_secret_value_in_checked_in_files(tmp_path: Path) -> None:
    model = compose_config("gpu", tmp_path, {"REDIS_PASSWORD": "s3cret-pw", "TBA_AUTH_TOKEN": "s3cret-tok"})
    assert model["services"]["buffer"]["environment"]["TBA_AUTH_TOKEN"] == "s3cret-tok"
    assert model["services"]["buffer"]["environment"]["TBA_REDIS_URL"] == "redis://:s3cret-pw@redis:6379/0"
    # The Redis password reaches redis-server through its environment, not its command line in the file.
    assert "s3cret-pw" not in " ".join(model["services"]["redis"]["command"])


@pytest.mark.parametrize("variant", sorted(COMPOSE_FILES))
def test_ports_are_published_on_loopback_only(variant: str, tmp_path: Path) -> None:
    model = compose_config(variant, tmp_path)
    published = [(name, p) for name, svc in model["services"].items() for p in svc.get("ports", [])]
    assert published, "the buffer API should be reachable from this host"
    for name, port in published:
        assert port.get("host_ip") == "127.0.0.1", f"{name} publishes {port} beyond loopback"


def test_smoke_run_never_takes_a_fixed_host_port(tmp_path: Path) -> None:
    model = compose_config("smoke", tmp_path)
    assert [p.get("published") in (None, "") for p in model["services"]["buffer"]["ports"]] == [True]


def _gpu_ids(service: dict) -> list[list[str]]:
    devices = service.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])
    return [d.get("device_ids") or [] for d in devices if "gpu" in d.get("capabilities", [])]


def test_gpu_host_by_default_one_gpu_each(tmp_path: Path) -> None:
    services = compose_config("gpu", tmp_path)["services"]
    assert _gpu_ids(services["trainer"]) == [["0"]]
    assert _gpu_ids(services["searcher"]) == [["1"]]
    assert services["trainer"]["build"]["target"] == "gpu"
    assert services["searcher"]["build"]["target"] == "gpu"


def test_one_searcher_per_gpu_override(tmp_path: Path) -> None:
    services = compose_config("gpus", tmp_path)["services"]
    searchers = {name: _gpu_ids(svc) for name, svc in services.items() if name.startswith("searcher")}
    assert searchers == {"searcher": [["1"]], "searcher-2": [["2"]], "searcher-3": [["3"]]}
    assert _gpu_ids(services["trainer"]) == [["0"]]
    # The extra searchers are full copies: same image, volumes and settings.
    for name in ("searcher-2", "searcher-3"):
        assert services[name]["image"] == services["searcher"]["image"]
        assert services[name]["environment"] == services["searcher"]["environment"]


def test_trainer_on_four_gpus_override(tmp_path: Path) -> None:
    """N GPUs for the trainer: as many ranks (TBA_TRAINER_PROCS) as GPUs reserved, shared memory for NCCL."""
    services = compose_config("trainer-gpus", tmp_path)["services"]
    trainer = services["trainer"]
    ids = _gpu_ids(trainer)
    assert ids == [["0", "1", "2", "3"]] and trainer["environment"]["TBA_TRAINER_PROCS"] == str(len(ids[0]))
    assert int(trainer["shm_size"]) >= 1 << 30
    # As documented, with no variable set: the searcher on a GPU of its own, not one of the ranks'.
    assert _gpu_ids(services["searcher"]) == [["4"]]


def test_cpu_override_drops_gpus_and_builds_cpu_images(tmp_path: Path) -> None:
    services = compose_config("cpu", tmp_path)["services"]
    for name in ("trainer", "searcher"):
        assert _gpu_ids(services[name]) == []
        assert services[name]["build"]["target"] == "cpu"
        assert services[name]["image"].endswith("-cpu")
        assert services[name]["environment"]["TBA_DTYPE"] == "float32"
    assert services["trainer"]["environment"]["TBA_DEVICE"] == "cpu"
    assert services["model-init"]["image"] == services["trainer"]["image"]


def _mounts(service: dict) -> dict[str, bool]:
    return {v["target"]: bool(v.get("read_only")) for v in service.get("volumes", []) if v.get("source")}


@pytest.mark.parametrize("variant", ["gpu", "cpu"])
def test_checkpoints_written_by_trainer_read_only_for_searchers(variant: str, tmp_path: Path) -> None:
    services = compose_config(variant, tmp_path)["services"]
    assert _mounts(services["trainer"]) == {"/models": True, "/checkpoints": False}
    assert _mounts(services["searcher"]) == {"/models": True, "/checkpoints": True}
    assert _mounts(services["model-init"]) == {"/models": False}
    env = services["searcher"]["environment"]
    assert env["TBA_CHECKPOINT_DIR"] == services["trainer"]["environment"]["TBA_CHECKPOINT_DIR"] == "/checkpoints"
    assert env["TBA_MODEL"] == services["trainer"]["environment"]["TBA_MODEL"] == "/models/base"


def test_start_order_is_gated_on_health(tmp_path: Path) -> None:
    services = compose_config("gpu", tmp_path)["services"]
    assert services["buffer"]["depends_on"]["redis"]["condition"] == "service_healthy"
    assert services["trainer"]["depends_on"]["buffer"]["condition"] == "service_healthy"
    for name in ("trainer", "searcher"):
        assert services[name]["depends_on"]["model-init"]["condition"] == "service_completed_successfully"
    assert services["searcher"]["depends_on"]["redis"]["condition"] == "service_healthy"
    for name in LONG_RUNNING:
        assert services[name]["restart"] == "unless-stopped", name
    for name in ("redis", "buffer"):
        assert services[name]["healthcheck"]["test"], name
    assert services["model-init"]["restart"] == "no"


def test_redis_persists_and_never_evicts(tmp_path: Path) -> None:
    redis = compose_config("gpu", tmp_path)["services"]["redis"]
    command = " ".join(redis["command"])
    for flag in ("--appendonly yes", "--appendfsync everysec", "--maxmemory-policy noeviction", "--requirepass"):
        assert flag in command
    assert {v["target"] for v in redis["volumes"]} == {"/data"}
    assert redis["user"] == "redis"


@pytest.mark.parametrize("variant", ["gpu", "openenv"])
def test_services_share_the_same_settings(variant: str, tmp_path: Path) -> None:
    services = compose_config(variant, tmp_path)["services"]
    common = ("TBA_REDIS_URL", "TBA_AUTH_TOKEN", "TBA_NAMESPACE", "TBA_TASK", "TBA_TEMPERATURE")
    for key in common:
        values = {services[n]["environment"][key] for n in ("buffer", "trainer", "searcher")}
        assert len(values) == 1, f"{key} differs between services: {values}"


@pytest.mark.parametrize("variant", ["gpu", "cpu", "openenv-cpu"])
def test_root_filesystems_are_read_only_with_writable_scratch(variant: str, tmp_path: Path) -> None:
    """As on Kubernetes (readOnlyRootFilesystem): only volumes and in-memory scratch are writable."""
    services = compose_config(variant, tmp_path)["services"]
    extra = ["envserver"] if "envserver" in services else []
    for name in ["redis", "buffer", "model-init", "trainer", "searcher", *extra]:
        assert services[name].get("read_only") is True, name
    for name in ["model-init", "trainer", "searcher", *extra]:
        scratch = {
            v["target"]: v.get("tmpfs", {}).get("mode") for v in services[name]["volumes"] if v["type"] == "tmpfs"
        }
        # World-writable with the sticky bit: the services run as uid 10001, tmpfs mounts belong to root.
        assert scratch == {"/tmp": 0o1777, "/var/cache/tba": 0o1777}, name


def test_monitoring_profile_runs_prometheus_and_grafana_with_the_dashboard(tmp_path: Path) -> None:
    assert "prometheus" not in compose_config("gpu", tmp_path)["services"], "monitoring must be opt-in"
    model = compose_config("gpu", tmp_path, {"COMPOSE_PROFILES": "monitoring", "GRAFANA_ADMIN_PASSWORD": "g-pw"})
    services = model["services"]
    for name in ("prometheus", "grafana"):
        svc = services[name]
        assert svc["user"] not in ("", "0", "root") and svc["read_only"] is True, name
        for mount in svc["volumes"]:
            if mount["type"] == "bind":  # the repo's monitoring/ files, mounted read-only
                assert mount.get("read_only") and Path(mount["source"]).is_file(), mount
    assert services["grafana"]["environment"]["GF_SECURITY_ADMIN_PASSWORD"] == "g-pw"
    mounted = {m["target"]: Path(m["source"]).name for m in services["grafana"]["volumes"] if m["type"] == "bind"}
    assert mounted["/var/lib/grafana/dashboards/tba-dashboard.json"] == "tba-dashboard.json"
    scrape = (Path(__file__).parents[2] / "monitoring/prometheus.yml").read_text()
    for target in ("buffer:8400", "trainer:9400", '"searcher"'):  # every service, on the ports compose gives it
        assert target in scrape, target


@pytest.mark.parametrize("variant", ["openenv", "openenv-cpu"])
def test_openenv_override_serves_an_environment_the_searchers_train_on(variant: str, tmp_path: Path) -> None:
    """docker-compose.openenv.yml: `tba envserver` as a service of its own image, healthy before any searcher
    starts, reachable on the Compose network only; the searchers' options make a valid openenv task for it."""
    from tba.tasks import make_task

    services = compose_config(variant, tmp_path)["services"]
    server = services["envserver"]
    assert server["build"]["dockerfile"] == "services/envserver/Dockerfile"
    assert server["command"][:4] == ["tba", "envserver", "--task", "calculator"]
    assert not server.get("ports") and not _gpu_ids(server), "published nowhere, no GPU"
    assert services["searcher"]["depends_on"]["envserver"]["condition"] == "service_healthy"
    env = services["searcher"]["environment"]
    assert env["TBA_TASK"] == "openenv"
    options = json.loads(env["TBA_TASK_OPTIONS"])
    assert options["url"] == "http://envserver:8010"
    calculator = make_task("calculator")
    assert (options["max_turns"], options["max_episode_tokens"], tuple(options["turn_stop"])) == (
        calculator.max_turns,
        calculator.max_episode_tokens,
        tuple(calculator.turn_stop),
    ), "the served task's own limits"
    assert make_task("openenv", options).url == options["url"]  # no connection until prompts are drawn
    assert services["model-init"]["environment"]["TBA_TASK"] == "calculator", "the served task's base model"
    # The served task, a server elsewhere and the limits are variables.
    services = compose_config(
        variant,
        tmp_path,
        {
            "ENV_TASK": "pkg.mod:Game",
            "ENV_TASK_OPTIONS": '{"level": 2}',
            "OPENENV_URL": "https://envs.example:443",
            "ENV_TASK_LIMITS": "'\"max_turns\": 8'",  # single quotes: .env takes the value as it is
        },
    )["services"]
    assert services["envserver"]["command"][3:6] == ["pkg.mod:Game", "--task-options", '{"level": 2}']
    assert json.loads(services["searcher"]["environment"]["TBA_TASK_OPTIONS"]) == {
        "url": "https://envs.example:443",
        "max_turns": 8,
    }
    assert services["model-init"]["environment"]["TBA_TASK"] == "pkg.mod:Game"
