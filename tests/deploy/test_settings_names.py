"""Every TBA_* variable that compose, k8s or a Dockerfile sets is a real settings field.

A misspelt variable is silently ignored by pydantic-settings (extra="ignore"), so
a typo in a deployment file would quietly run with a default. The settings classes
are the one source of truth (tba/settings.py); this reads them, not a copy.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tba.settings import ENV_PREFIX, BufferSettings, CommonSettings, SearcherSettings, TrainerSettings
from tests.deploy.tools import COMPOSE_FILES, DOCKERFILES, ROOT, compose_config, k8s_copy_with_secrets, kustomize

pytestmark = pytest.mark.deploy
CLASSES: dict[str, type[CommonSettings]] = {
    "buffer": BufferSettings,
    "trainer": TrainerSettings,
    "searcher": SearcherSettings,
}
EVERY_FIELD = {ENV_PREFIX + name.upper() for cls in CLASSES.values() for name in cls.model_fields}
TBA_NAME = re.compile(r"\bTBA_[A-Z0-9_]+\b")


def fields_of(service: str) -> set[str]:
    cls = next((c for prefix, c in CLASSES.items() if service.startswith(prefix)), None)
    return EVERY_FIELD if cls is None else {ENV_PREFIX + name.upper() for name in cls.model_fields}


def test_every_name_in_the_checked_in_files_is_a_field() -> None:
    files = [ROOT / f for fs in COMPOSE_FILES.values() for f in fs] + list(DOCKERFILES)
    files += sorted(ROOT.glob("k8s/**/*.yaml")) + [ROOT / ".env.example"]
    unknown = {}
    for path in set(files):
        names = set(TBA_NAME.findall(path.read_text())) - EVERY_FIELD
        if names:
            unknown[str(path.relative_to(ROOT))] = sorted(names)
    assert not unknown, f"not settings fields (tba/settings.py): {unknown}"


@pytest.mark.parametrize("variant", sorted(COMPOSE_FILES))
def test_each_compose_service_gets_only_its_own_settings(variant: str, tmp_path: Path) -> None:
    for name, svc in compose_config(variant, tmp_path)["services"].items():
        given = {k for k in svc.get("environment", {}) if k.startswith(ENV_PREFIX)}
        assert given <= fields_of(name), f"{name}: {sorted(given - fields_of(name))}"


def test_each_k8s_container_gets_only_its_own_settings(tmp_path: Path) -> None:
    k8s = k8s_copy_with_secrets(tmp_path)
    for overlay in ("gpu", "cpu-dev"):
        docs = kustomize(k8s / "overlays" / overlay)
        (config_map,) = [d for d in docs if d["kind"] == "ConfigMap"]
        shared = set(config_map["data"])
        assert shared <= EVERY_FIELD, sorted(shared - EVERY_FIELD)
        for w in docs:
            if w["kind"] not in ("Deployment", "StatefulSet", "Job"):
                continue
            for c in w["spec"]["template"]["spec"]["containers"]:
                given = {e["name"] for e in c.get("env", []) if e["name"].startswith(ENV_PREFIX)}
                assert given <= fields_of(c["name"]), f"{overlay}/{c['name']}: {sorted(given - fields_of(c['name']))}"


def test_the_check_would_catch_a_typo() -> None:
    assert "TBA_CHECKPOINT_EVERY" in fields_of("trainer")
    assert "TBA_CHECKPOINT_EVRY" not in EVERY_FIELD
    assert "TBA_KV_CACHE_GIB" not in fields_of("trainer") and "TBA_KV_CACHE_GIB" in fields_of("searcher")


def test_values_given_to_each_compose_service_are_valid_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not just the names: the values compose passes load into the service's settings class."""
    services = compose_config("smoke", tmp_path)["services"]
    for name, cls in CLASSES.items():
        for key in list(os.environ):
            if key.startswith(ENV_PREFIX):
                monkeypatch.delenv(key)
        for key, value in services[name]["environment"].items():
            monkeypatch.setenv(key, str(value))
        settings = cls()
        assert settings.redis_url.startswith("redis://:dummy-redis-password@redis:6379")
