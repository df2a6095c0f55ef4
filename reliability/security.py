"""Security: the token, the Redis password and the secrets, tried against the real processes.

``python -m reliability.security`` (``make security``) starts a real Redis that requires a password
and a real ``tba buffer`` holding a bearer token, then checks:

1. **The token.** Every route that writes or samples refuses a request without the token, with a
   wrong one, with the right one under another scheme, or with a prefix of it (401 and a
   ``WWW-Authenticate`` header), and serves the right one. The comparison is of SHA-256 digests
   with :func:`hmac.compare_digest`; the run also times wrong tokens that share all but their last
   character with the right one against tokens that share nothing, and reports the difference
   (a figure, not a pass criterion: it is noise-level on any machine).
2. **The Redis password end to end.** With the password in ``TBA_REDIS_URL`` the buffer is ready
   and stores and serves groups (over HTTP and from the stream); without it, or with a wrong one,
   it stays up, answers ``/readyz`` with 503 and a reason, and stores nothing.
3. **No secret anywhere it could leak.** The token and the password appear in none of the buffers'
   logs, the answers of ``/v1/stats``, ``/metrics``, ``/readyz`` and of every refused request, nor in
   what the buffer keeps in Redis or in Redis's own files; nor anywhere in a short ``tba up`` run given
   both (every file of its run directory: checkpoints with the trainer's state, logs, summary, report,
   TensorBoard and W&B files; and its output).
4. **Containers.** Every service of docker-compose.yml runs as a non-root user on a read-only root
   file system, every Dockerfile ends as a numeric non-root user, and every container of the
   Kubernetes manifests sets ``runAsNonRoot`` and ``readOnlyRootFilesystem`` (where it is defined;
   tests/deploy/test_k8s.py checks the same on every rendered overlay).

The run writes the "security" section of RELIABILITY.md; tests/reliability/test_security.py runs
it with fewer timed requests and ``--no-local-run`` (tests/e2e/test_local_run.py searches its own run's
directory) and asserts the same checks from ``--result``, without writing it.
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import redis
import yaml

from reliability.payloads import group_dict
from reliability.report import finish, table, write_result
from reliability.services import ROOT, BufferProcess
from tba.codec import JSON_MEDIA_TYPE, pack
from tba.keys import STREAM_FIELD, Keys
from tba.leaks import files_under, leaks
from tba.redis_client import sync_client
from tba.redis_server import RedisServer

WRITE_ROUTES = ("/v1/sample", "/v1/groups")
TIMED_REQUESTS = 500
OPEN_ROUTES = ("/v1/stats", "/metrics", "/readyz", "/healthz")


@dataclass
class Check:
    """One thing tried, how many times, and what came of it."""

    what: str
    tries: int
    passed: bool
    detail: str


@dataclass
class SecurityResult:
    checks: list[Check] = field(default_factory=list)
    timing_us: dict[str, float] = field(default_factory=dict)  # median latency of each kind of wrong token
    timed_requests: int = 0

    def problems(self) -> list[str]:
        return [f"{c.what}: {c.detail}" for c in self.checks if not c.passed]

    @property
    def passed(self) -> bool:
        return not self.problems()

    def add(self, what: str, tries: int, passed: bool, detail: str) -> None:
        self.checks.append(Check(what, tries, passed, detail))


# --- 1. the token ---


def _bodies(seq: int) -> dict[str, bytes]:
    group = group_dict(f"sec-{seq}", f"p{seq}", [[5, 6, seq % 100 + 7]], [1.0])
    request = {"num_prompts": 1, "samples_per_prompt": 1, "trainer_version": 0}
    return {"/v1/groups": pack(group), "/v1/sample": pack(request)}


def check_token(buffer: BufferProcess, result: SecurityResult, answers: list[str]) -> None:
    token = buffer.token
    wrong = {
        "no Authorization header": None,
        "a wrong token": f"Bearer {secrets.token_urlsafe(24)}",
        "the token under the Basic scheme": f"Basic {token}",
        "a prefix of the token": f"Bearer {token[:-1]}",
        "the token with a suffix": f"Bearer {token}x",
        "the bearer scheme alone": "Bearer",
    }
    with httpx.Client(base_url=buffer.url, timeout=10) as http:
        before = http.get("/v1/stats").json()["groups_ingested"]
        for name, header in wrong.items():
            statuses = []
            for i, route in enumerate(WRITE_ROUTES):
                headers = {"Content-Type": "application/msgpack", "Accept": JSON_MEDIA_TYPE}
                if header is not None:
                    headers["Authorization"] = header
                r = http.post(route, content=_bodies(i)[route], headers=headers)
                answers.append(r.text)
                statuses.append((route, r.status_code, "www-authenticate" in r.headers))
            ok = all(code == 401 and challenged for _, code, challenged in statuses)
            result.add(
                f"write and sample with {name}",
                len(statuses),
                ok,
                ", ".join(f"{route} {code}" for route, code, _ in statuses),
            )
        stored = http.get("/v1/stats").json()
        answers.append(str(stored))
        result.add(
            "nothing stored by a refused request",
            1,
            stored["groups_ingested"] == before,
            f"groups_ingested {before} before, {stored['groups_ingested']} after",
        )
        statuses = []
        for i, route in enumerate(WRITE_ROUTES):
            r = http.post(
                route,
                content=_bodies(100 + i)[route],
                headers={
                    "Content-Type": "application/msgpack",
                    "Accept": JSON_MEDIA_TYPE,
                    "Authorization": f"Bearer {token}",
                },
            )
            answers.append(r.text)
            statuses.append((route, r.status_code))
        result.add(
            "write and sample with the token",
            len(statuses),
            all(c in (200, 409) for _, c in statuses),
            ", ".join(f"{route} {code}" for route, code in statuses),
        )


def time_wrong_tokens(buffer: BufferProcess, requests: int) -> dict[str, float]:
    """Median latency (µs) of 401s for a token equal but for its last character, and for an unrelated one of
    the same length: a comparison that stops at the first difference would make the first slower."""
    token = buffer.token
    near = token[:-1] + ("A" if token[-1] != "A" else "B")
    far = "".join("A" if c != "A" else "B" for c in token)
    times: dict[str, list[float]] = {"near": [], "far": []}
    body = pack({"num_prompts": 1, "samples_per_prompt": 1, "trainer_version": 0})
    with httpx.Client(base_url=buffer.url, timeout=10) as http:
        for i in range(2 * requests):
            kind = "near" if i % 2 else "far"
            headers = {"Content-Type": "application/msgpack", "Authorization": f"Bearer {near if i % 2 else far}"}
            t0 = time.perf_counter()
            r = http.post("/v1/sample", content=body, headers=headers)
            times[kind].append((time.perf_counter() - t0) * 1e6)
            assert r.status_code == 401, r.text
    return {kind: statistics.median(ts) for kind, ts in times.items()}


# --- 2. the Redis password ---


def check_redis_password(
    server: RedisServer,
    work: Path,
    token: str,
    result: SecurityResult,
    answers: list[str],
    logs: list[Path],
    timed_requests: int,
) -> None:
    """The buffer with the password stores and serves; without it, or with a wrong one, it says why."""
    for label, url in (
        ("no password", server.url_without_password),
        ("a wrong password", server.url_with(secrets.token_urlsafe(16))),
    ):
        log = work / f"buffer-{label.replace(' ', '-')}.log"
        logs.append(log)
        buffer = BufferProcess(url, log, token, log_level="INFO")
        try:
            buffer.launch()
            reason, code = "", 0
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not reason:
                try:
                    r = httpx.get(f"{buffer.url}/readyz", timeout=2)
                    code, reason = r.status_code, r.text.strip()
                except httpx.HTTPError:
                    time.sleep(0.2)
            answers.append(reason)
            r = httpx.post(
                f"{buffer.url}/v1/groups",
                content=_bodies(7)["/v1/groups"],
                headers={**buffer.headers, "Content-Type": "application/msgpack"},
                timeout=10,
            )
            answers.append(r.text)
            ok = (
                code == 503
                and (
                    "Authentication" in reason
                    or "NOAUTH" in reason
                    or "WRONGPASS" in reason
                    or "invalid" in reason.lower()
                )
                and r.status_code == 503
                and buffer.alive()
            )
            result.add(
                f"Redis with {label}: not ready, says why, stores nothing",
                1,
                ok,
                f"/readyz {code}: {reason[:120]}; POST /v1/groups {r.status_code}",
            )
        finally:
            buffer.stop()
    sync = sync_client(server.url)
    result.add("Redis refuses a client without the password", 1, _refused(server.url_without_password), "")
    stream = Keys().trajectories
    sync.xadd(stream, {STREAM_FIELD: pack(group_dict("sec-stream", "ps", [[9, 9, 9]], [0.5]))})
    log = work / "buffer.log"
    logs.append(log)
    buffer = BufferProcess(server.url, log, token, log_level="INFO").start()
    try:
        deadline = time.monotonic() + 20
        stats: dict = {}
        while time.monotonic() < deadline:
            stats = httpx.get(f"{buffer.url}/v1/stats", timeout=5).json()
            if stats["groups_stored"] >= 1:
                break
            time.sleep(0.1)
        answers.append(str(stats))
        result.add(
            "Redis with the password: ready, the stream's group stored",
            1,
            stats.get("groups_stored") == 1,
            f"groups_stored {stats.get('groups_stored')}",
        )
        check_token(buffer, result, answers)
        for route in OPEN_ROUTES:
            answers.append(httpx.get(f"{buffer.url}{route}", timeout=5).text)
        for key in sync.scan_iter(count=1000):
            answers.append(repr(_dump(sync, key)))
        result.timing_us = time_wrong_tokens(buffer, timed_requests)
        result.timed_requests = timed_requests
    finally:
        buffer.stop()


def _refused(url: str) -> bool:
    try:
        sync_client(url, timeout=2).set("probe", "1")
    except redis.AuthenticationError:
        return True
    except redis.ResponseError as err:
        return "NOAUTH" in str(err)
    return False


def _dump(client: redis.Redis, key: bytes) -> object:
    kind = client.type(key).decode()
    read = {
        "string": client.get,
        "hash": client.hgetall,
        "zset": lambda k: client.zrange(k, 0, -1),
        "set": client.smembers,
        "list": lambda k: client.lrange(k, 0, -1),
        "stream": lambda k: client.xrange(k),
    }
    return (key, read[kind](key)) if kind in read else key


# --- 3. secrets ---


def check_local_run(work: Path, token: str, password: str, result: SecurityResult, max_steps: int = 6) -> None:
    """A short ``tba up`` with both secrets given, as a user gives them (``TBA_AUTH_TOKEN``, ``REDIS_PASSWORD``);
    then every file it wrote is searched for them."""
    from tba.local.commands import tba_command
    from tba.model.sft import ensure_base_model

    run_dir = work / "run"
    env = {**os.environ, "TBA_AUTH_TOKEN": token, "REDIS_PASSWORD": password, "TBA_CHECKPOINT_EVERY": "2"}
    cmd = tba_command(
        "up",
        no_console=True,
        searchers=1,
        placement="shared",
        minutes=5,
        max_steps=max_steps,
        run_dir=run_dir,
        base_model=ensure_base_model(),
        eval_every=20,
        eval_prompts=20,
        wandb="offline",
    )
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    checkpoints = len(list((run_dir / "checkpoints").glob("step-*")))
    files = files_under(run_dir)
    found = leaks({"token": token, "Redis password": password}, [proc.stdout, proc.stderr], files)
    result.add(
        "no secret in a whole `tba up` run directory (checkpoints, logs, summary, report, TensorBoard, W&B)",
        len(files),
        proc.returncode == 0 and checkpoints > 0 and not found,
        f"tba up exited {proc.returncode}: {proc.stderr[-300:]}"
        if proc.returncode
        else "; ".join(found[:5])
        if found
        else f"{len(files)} files searched, {checkpoints} checkpoint(s) among them",
    )


# --- 4. containers ---


def check_containers(result: SecurityResult) -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    bad = [
        name
        for name, svc in compose["services"].items()
        if not svc.get("read_only") or str(svc.get("user", "")).split(":")[0] in ("root", "0")
    ]
    no_user = [
        name
        for name, svc in compose["services"].items()
        if "user" not in svc and "build" not in svc and not str(svc.get("image", "")).startswith("${")
    ]
    result.add(
        "docker-compose.yml: every service read-only, none as root",
        len(compose["services"]),
        not bad and not no_user,
        f"offending: {bad + no_user}" if bad or no_user else f"{len(compose['services'])} services",
    )
    dockerfiles = sorted((ROOT / "services").glob("*/Dockerfile"))
    roots = []
    for path in dockerfiles:
        stages = re.split(r"^FROM ", path.read_text(), flags=re.M)[1:]
        for stage in stages:
            users = re.findall(r"^USER\s+(\S+)", stage, flags=re.M)
            name = stage.split()[2] if " AS " in stage.splitlines()[0].upper() else stage.split()[0]
            runs = "CMD" in stage or "ENTRYPOINT" in stage
            if runs and (not users or users[-1].split(":")[0] in ("root", "0")):
                roots.append(f"{path.relative_to(ROOT)} ({name})")
    result.add(
        "Dockerfiles: every runnable stage ends as a non-root user",
        len(dockerfiles),
        not roots,
        f"offending: {roots}" if roots else f"{len(dockerfiles)} Dockerfiles",
    )
    containers, offending = 0, []
    for path in sorted((ROOT / "k8s").rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            spec = _pod_spec(doc)
            if spec is None:
                continue
            pod_ctx = spec.get("securityContext", {})
            for c in spec.get("initContainers", []) + spec.get("containers", []):
                if "image" not in c:  # an overlay's patch of a container defined in full elsewhere
                    continue
                containers += 1
                ctx = {**pod_ctx, **c.get("securityContext", {})}
                if not ctx.get("runAsNonRoot") or not c.get("securityContext", {}).get("readOnlyRootFilesystem"):
                    offending.append(f"{path.relative_to(ROOT)}:{c['name']}")
    result.add(
        "Kubernetes: every container runAsNonRoot with a read-only root file system",
        containers,
        containers > 0 and not offending,
        f"offending: {offending}" if offending else f"{containers} containers",
    )


def _pod_spec(doc: object) -> dict | None:
    if not isinstance(doc, dict):
        return None
    spec = doc.get("spec", {})
    if doc.get("kind") == "Pod":
        return spec
    template = spec.get("jobTemplate", {}).get("spec", {}).get("template") or spec.get("template")
    return template.get("spec") if isinstance(template, dict) else None


# --- the run ---


def security(work: Path, timed_requests: int = TIMED_REQUESTS, local_run: bool = True) -> SecurityResult:
    """Every check; ``local_run``: also a short ``tba up`` whose run directory is searched (a minute or two; the
    test suite searches its own end-to-end run's directory instead, tests/e2e/test_local_run.py)."""
    token, password = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
    result = SecurityResult()
    answers: list[str] = []
    logs: list[Path] = []
    server = RedisServer(work / "redis", password=password).start()
    try:
        check_redis_password(server, work, token, result, answers, logs, timed_requests)
    finally:
        server.stop()
    files = [*logs, *files_under(work / "redis")]
    found = leaks({"token": token, "Redis password": password}, answers, files)
    result.add(
        "no secret in logs, answers, stored data or Redis's files",
        len(answers) + len(files),
        not found,
        "; ".join(found[:5]) if found else f"{len(answers)} answers, {len(files)} files searched",
    )
    if local_run:
        check_local_run(work, token, password, result)
    check_containers(result)
    return result


def render(result: SecurityResult) -> str:
    rows = [[c.what, c.tries, "pass" if c.passed else "**FAIL**", c.detail] for c in result.checks]
    near, far = result.timing_us.get("near", float("nan")), result.timing_us.get("far", float("nan"))
    return (
        f"**{'PASS' if result.passed else 'FAIL'}**: {sum(c.passed for c in result.checks)} of "
        f"{len(result.checks)} checks.\n\n"
        + table(["check", "tries", "outcome", "detail"], rows)
        + f"\nWrong tokens ({result.timed_requests} each, median of the 401's round trip): equal to the token but "
        f"for the last character {near:.0f} µs, sharing nothing {far:.0f} µs (difference "
        f"{near - far:+.0f} µs: the digests are compared in constant time, what remains is noise).\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reliability.security", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--timed-requests", type=int, default=TIMED_REQUESTS, help="wrong-token requests timed per kind"
    )
    parser.add_argument(
        "--no-local-run", action="store_true", help="skip the short `tba up` whose run directory is searched"
    )
    parser.add_argument("--no-report", action="store_true", help="do not rewrite RELIABILITY.md")
    parser.add_argument("--result", type=Path, default=None, help="also write what the run found as JSON here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tba-security-") as tmp:
        result = security(Path(tmp), args.timed_requests, local_run=not args.no_local_run)
    if args.result:
        write_result(args.result, result, result.problems())
    return finish(
        "security", render(result), result.problems(), sys.argv[1:] if argv is None else argv, write=not args.no_report
    )


if __name__ == "__main__":
    sys.exit(main())
