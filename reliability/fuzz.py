"""Fuzz: the buffer's HTTP API under schemathesis, and its stream ingest under poison entries.

``python -m reliability.fuzz`` (``make fuzz``) starts a real Redis (AOF, as ``tba up`` does) and a
real ``tba buffer`` process with a bearer token, then

1. runs schemathesis against the buffer's own OpenAPI document: every phase (examples, coverage,
   fuzzing, stateful), every check (server errors, status codes, content types, response headers
   and schemas, negative data rejected, positive data accepted, response time, auth ...), at
   least ``--min-cases`` cases. Requests carry the token and ``Accept: application/json``, and
   their bodies are JSON: the document offers msgpack too, as an opaque binary string schemathesis
   can only fill with noise, so the harness narrows each request body to its JSON schema (and a
   group's objective to the run's: :func:`harness_document`);
2. puts hand-made poison entries on the trajectory stream (bad msgpack, not a map, wrong schema
   version, missing fields, over the size limit, NaN/inf, wrong types, no payload field), each
   ``--poison-repeats`` times with a valid group after every one, and checks that each is
   dead-lettered with a reason naming the problem, counted in ``/v1/stats``, and that every valid
   group is stored (the ingest never stalls behind a bad entry).

Pass: 0 responses with a 5xx status, 0 check failures (a schema violation is one), the buffer
alive and ready at the end; every poison entry dead-lettered with its reason, every valid group
stored. The run writes the "fuzz" section of RELIABILITY.md; the test suite runs a short form
(tests/reliability/test_fuzz.py) and asserts the same criteria without writing it.
"""

from __future__ import annotations

import argparse
import base64
import json
import math
import secrets
import shlex
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import msgpack

from reliability.payloads import REFERENCE, TEMPERATURE, group_dict
from reliability.report import finish, table, write_result
from reliability.services import BufferProcess, suite_redis
from tba.codec import JSON_MEDIA_TYPE, pack
from tba.keys import STREAM_FIELD, Keys
from tba.redis_client import sync_client

# The buffer's size limit during the run: small enough that the oversized poison entries (and any
# body schemathesis generates past it) stay cheap to hold in Redis, well above any valid message here.
MAX_PAYLOAD_BYTES = 1 << 20
# The longest the buffer holds a sample request it cannot serve (its max_sample_wait_seconds): a fuzzed
# request asking for a minute's long-poll would otherwise hold the fuzzer a minute without testing more.
MAX_FUZZ_WAIT_SECONDS = 0.2


# --- 1. schemathesis against the OpenAPI document ---


@dataclass
class Failure:
    """One distinct failure: a check that failed on one operation, with the first case that showed it."""

    operation: str
    check: str
    code: str
    title: str
    message: str
    count: int
    answer: str  # the status and the start of the body the buffer answered with
    reproducer: str


@dataclass
class SchemathesisResult:
    version: str
    seed: int | None
    max_examples: int
    cases: int
    documented: set[str]  # "METHOD /path" of every operation the document lists
    responses: dict[str, Counter[int]]  # operation -> status code -> responses
    failures: list[Failure]
    errors: list[str]  # requests that got no answer, or schemathesis's own errors
    seconds: float
    report_dir: Path

    @property
    def server_errors(self) -> int:
        return sum(n for codes in self.responses.values() for code, n in codes.items() if code >= 500)


def harness_document(openapi: dict[str, Any]) -> dict[str, Any]:
    """The buffer's document as the harness feeds it to schemathesis, narrowed in three ways only.

    Each request body keeps just its JSON form (see the module's docstring). A group's objective
    (``temperature``, ``reference``) is pinned to the run's: the buffer takes groups of the first
    objective it sees and answers 409 to any other, so groups of random objectives would all stop at
    that check and the storing path behind it would go unfuzzed. Negative cases still break these
    fields (leave them out, give them the wrong type): only their valid values are narrowed."""
    doc = json.loads(json.dumps(openapi))
    for operations in doc["paths"].values():
        for op in operations.values():
            content = op.get("requestBody", {}).get("content", {})
            if JSON_MEDIA_TYPE in content:
                op["requestBody"]["content"] = {JSON_MEDIA_TYPE: content[JSON_MEDIA_TYPE]}
    group = doc["components"]["schemas"]["ScoredGroup"]["properties"]
    for name, value in (("temperature", TEMPERATURE), ("reference", REFERENCE)):
        if name in group:
            group[name] = {**group[name], "enum": [value]}
    # Rules JSON Schema cannot state: per-token log-probs, when given, are as many as the completion's ids;
    # environment spans are sorted, disjoint ranges inside it. Both fields are left out of the document (the
    # poison entries below try wrong lengths; tests/unit/test_schemas.py bad spans).
    for name in ("token_logprobs", "env_spans"):
        del doc["components"]["schemas"]["ScoredSample"]["properties"][name]
    return doc


def run_schemathesis(
    buffer: BufferProcess, workdir: Path, max_examples: int, seed: int | None, timeout: float
) -> SchemathesisResult:
    """Run the schemathesis CLI against ``buffer`` and read its JSON and NDJSON reports."""
    workdir = workdir.resolve()  # the CLI runs in it: every path handed to it must be absolute
    workdir.mkdir(parents=True, exist_ok=True)
    spec = workdir / "openapi.json"
    openapi = httpx.get(f"{buffer.url}/openapi.json", timeout=10).raise_for_status().json()
    spec.write_text(json.dumps(harness_document(openapi), indent=1))
    report_dir = workdir / "schemathesis"
    cmd = [
        sys.executable,
        "-m",
        "schemathesis.cli",
        "run",
        str(spec),
        "--url",
        buffer.url,
        "-H",
        f"Authorization: Bearer {buffer.token}",
        "-H",
        f"Accept: {JSON_MEDIA_TYPE}",
        "--checks",
        "all",
        "--max-examples",
        str(max_examples),
        "--continue-on-failure",
        "--workers",
        "1",
        "--request-timeout",
        "30",
        "--generation-database",
        "none",
        "--report",
        "json,ndjson",
        "--report-dir",
        str(report_dir),
        "--report-json-path",
        str(report_dir / "run.json"),
        "--report-ndjson-path",
        str(report_dir / "events.ndjson"),
        "--no-color",
    ]
    if seed is not None:
        cmd += ["--seed", str(seed)]
    t0 = time.monotonic()
    with (workdir / "schemathesis.log").open("w") as log:
        # cwd: the work dir, so that no schemathesis.toml of anyone else's is read
        proc = subprocess.run(cmd, cwd=workdir, stdout=log, stderr=subprocess.STDOUT, timeout=timeout)
    seconds = time.monotonic() - t0
    run_path = report_dir / "run.json"
    if not run_path.exists():
        tail = (workdir / "schemathesis.log").read_text()[-3000:]
        raise RuntimeError(f"schemathesis exited with {proc.returncode} and wrote no report:\n{tail}")
    run = json.loads(run_path.read_text())
    responses, failures, errors = read_events(report_dir / "events.ndjson", buffer.url)
    errors += [json.dumps(e)[:500] for e in run.get("errors", [])]
    documented = {f"{method.upper()} {path}" for path, ops in openapi["paths"].items() for method in ops}
    return SchemathesisResult(
        version=run["schemathesis_version"],
        seed=run.get("seed"),
        max_examples=max_examples,
        documented=documented,
        cases=run["test_cases"]["generated"],
        responses=responses,
        failures=failures,
        errors=errors,
        seconds=seconds,
        report_dir=report_dir,
    )


def read_events(path: Path, base_url: str) -> tuple[dict[str, Counter[int]], list[Failure], list[str]]:
    """Responses by operation and status, distinct failures with a reproducer each, and requests left unanswered."""
    responses: dict[str, Counter[int]] = {}
    failures: dict[tuple[str, str, str], Failure] = {}
    errors: list[str] = []
    with path.open() as events:
        for line in events:
            event = json.loads(line)
            finished = event.get("ScenarioFinished")
            if finished is None:
                continue
            recorder = finished["recorder"]
            for case_id, interaction in recorder.get("interactions", {}).items():
                case = recorder["cases"][case_id]["value"]
                operation = f"{case['method']} {case['path']}"
                response = interaction.get("response")
                if response is None:
                    errors.append(f"{operation}: no response ({curl(interaction['request'], base_url)})")
                    continue
                responses.setdefault(operation, Counter())[response["status_code"]] += 1
            for case_id, checks in recorder.get("checks", {}).items():
                for check in checks:
                    if check["status"] == "success":
                        continue
                    info = check.get("failure_info") or {}
                    failure = info.get("failure", {})
                    case = recorder["cases"][case_id]["value"]
                    operation = failure.get("operation") or f"{case['method']} {case['path']}"
                    key = (operation, check["name"], failure.get("code", ""))
                    if key in failures:
                        failures[key].count += 1
                        continue
                    interaction = recorder.get("interactions", {}).get(case_id) or {}
                    failures[key] = Failure(
                        operation=operation,
                        check=check["name"],
                        code=failure.get("code", ""),
                        title=failure.get("title", ""),
                        message=failure.get("message", "")[:600],
                        count=1,
                        answer=answer(interaction.get("response")),
                        reproducer=curl(interaction["request"], base_url) if interaction else "",
                    )
    return responses, sorted(failures.values(), key=lambda f: (f.operation, f.check)), errors


def answer(response: dict[str, Any] | None, chars: int = 300) -> str:
    """``<status> <body>`` of a recorded response, the body cut at ``chars``."""
    if response is None:
        return "no response"
    content = response.get("content") or {}
    raw = base64.b64decode(content["$base64"]) if isinstance(content, dict) and "$base64" in content else b""
    return f"{response['status_code']} {raw[:chars].decode('utf-8', errors='backslashreplace')}"


def curl(request: dict[str, Any], base_url: str) -> str:
    """A curl command that sends the recorded request again (the token from ``$TBA_AUTH_TOKEN``)."""
    parts = ["curl", "-sS", "-X", request["method"]]
    for name, values in request.get("headers", {}).items():
        if name.lower() in (
            "authorization",
            "user-agent",
            "accept-encoding",
            "connection",
            "content-length",
            "x-schemathesis-testcaseid",
        ):
            continue
        parts += ["-H", f"{name}: {values[0]}"]
    cmd = " ".join(shlex.quote(p) for p in parts)
    cmd += ' -H "Authorization: Bearer $TBA_AUTH_TOKEN" -H "Accept: application/json"'
    body = request.get("body")
    if body:
        raw = base64.b64decode(body["$base64"]) if isinstance(body, dict) else str(body).encode()
        shown = raw.decode("utf-8", errors="backslashreplace")
        if len(shown) > 400:
            shown = shown[:400] + f"... ({len(raw)} bytes; the full request is in the NDJSON report)"
        cmd += " --data-binary " + shlex.quote(shown)
    url = request["uri"]
    if url.startswith(base_url):
        url = "$BUFFER_URL" + url[len(base_url) :]
    return cmd + f' "{url}"'


# --- 2. poison entries on the trajectory stream ---


@dataclass(frozen=True)
class Poison:
    """A stream entry the buffer must dead-letter, with the words its reason must contain."""

    name: str
    fields: dict[str, bytes]
    reason: str


def _valid(seq: int) -> dict[str, Any]:
    return group_dict(
        group_id=f"valid-{seq}-{uuid.uuid4().hex}",
        prompt_id=f"valid-{seq}",
        completions=[[seq + 10, 1], [seq + 10, 2]],
        rewards=[0.0, 1.0],
    )


def _bad(change: Callable[[dict[str, Any]], object]) -> dict[str, bytes]:
    """A valid group's entry with one thing broken by ``change`` (which edits the group dict in place)."""
    group = group_dict(group_id=uuid.uuid4().hex, prompt_id="poison", completions=[[5, 6], [5, 7]], rewards=[0.0, 1.0])
    change(group)
    return {STREAM_FIELD: msgpack.packb(group, use_bin_type=True)}


def _set(path: str, value: object) -> Callable[[dict[str, Any]], None]:
    """Set ``a.0.b`` (dots, list indexes as numbers) to ``value``."""
    *parents, last = path.split(".")

    def change(group: dict[str, Any]) -> None:
        node: Any = group
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        node[last] = value

    return change


def _drop(*names: str) -> Callable[[dict[str, Any]], None]:
    def change(group: dict[str, Any]) -> None:
        for name in names:
            del group[name]

    return change


def poison_catalogue() -> list[Poison]:
    """Every kind of bad entry the issue names, a few ways each: fresh payloads on every call."""
    good = pack(group_dict(group_id=uuid.uuid4().hex, prompt_id="poison", completions=[[5, 6]], rewards=[1.0]))
    return [
        # bad msgpack
        Poison("not msgpack", {STREAM_FIELD: b"\xc1 not msgpack"}, "not valid msgpack"),
        Poison("empty payload", {STREAM_FIELD: b""}, "not valid msgpack"),
        Poison("truncated msgpack", {STREAM_FIELD: good[:-3]}, "not valid msgpack"),
        Poison("trailing bytes", {STREAM_FIELD: good + b"\x00"}, "not valid msgpack"),
        Poison("nested 100,000 deep", {STREAM_FIELD: b"\x91" * 100_000 + b"\xc0"}, "not valid msgpack"),
        Poison("integer map keys", {STREAM_FIELD: msgpack.packb({1: 2})}, "not valid msgpack"),
        # not a map
        Poison("array, not a map", {STREAM_FIELD: msgpack.packb([1, 2, 3])}, "map at the top level, got list"),
        Poison("string, not a map", {STREAM_FIELD: msgpack.packb("group")}, "map at the top level, got str"),
        # wrong schema
        Poison("schema version 99", _bad(_set("schema_version", 99)), "schema_version"),
        Poison("missing prompt_id, samples", _bad(_drop("prompt_id", "samples")), "prompt_id: Field required"),
        Poison("no samples", _bad(_set("samples", [])), "samples: List should have at least 1"),
        Poison("unknown field", _bad(_set("evil", 1)), "evil: Extra inputs are not permitted"),
        Poison("policy_version 2**21", _bad(_set("policy_version", 2**21)), "policy_version"),
        Poison("negative token id", _bad(_set("prompt_ids", [-1])), "prompt_ids.0"),
        Poison("token_logprobs too short", _bad(_set("samples.0.token_logprobs", [-1.0])), "token_logprobs"),
        Poison("another objective (temperature 1.0)", _bad(_set("temperature", 1.0)), "objective mismatch"),
        # over the size limit
        Poison("payload over the limit", {STREAM_FIELD: b"\x00" * (MAX_PAYLOAD_BYTES + 1)}, "over the limit"),
        Poison("valid group over the limit", _bad(_set("prompt_text", "x" * MAX_PAYLOAD_BYTES)), "over the limit"),
        # NaN and inf
        Poison("NaN reward", _bad(_set("samples.0.reward", math.nan)), "samples.0.reward"),
        Poison("+inf reward", _bad(_set("samples.1.reward", math.inf)), "samples.1.reward"),
        Poison("-inf logprob_sum", _bad(_set("samples.0.logprob_sum", -math.inf)), "samples.0.logprob_sum"),
        Poison("NaN ref_logprob_sum", _bad(_set("samples.0.ref_logprob_sum", math.nan)), "samples.0.ref_logprob_sum"),
        Poison("1e308 reward (sums overflow)", _bad(_set("samples.0.reward", 1e308)), "samples.0.reward"),
        Poison("inf created_at", _bad(_set("created_at", math.inf)), "created_at"),
        # wrong types
        Poison("reward as a string", _bad(_set("samples.0.reward", "1.0")), "samples.0.reward"),
        Poison("policy_version as a boolean", _bad(_set("policy_version", True)), "policy_version"),
        Poison("prompt_ids as a string", _bad(_set("prompt_ids", "1 2 3")), "prompt_ids"),
        Poison("completion id as a float", _bad(_set("samples.0.completion_ids", [1.5])), "samples.0.completion_ids"),
        Poison("group_id as an integer", _bad(_set("group_id", 7)), "group_id"),
        Poison("reward as a msgpack ext", _bad(_set("samples.0.reward", msgpack.ExtType(1, b"x"))), "samples.0.reward"),
        Poison("samples as a map", _bad(_set("samples", {"0": 1})), "samples"),
        # no payload field
        Poison("no field 'g'", {"wrong-field": good}, f"no field '{STREAM_FIELD}'"),
    ]


@dataclass
class PoisonOutcome:
    name: str
    sent: int
    dead_lettered: int = 0
    with_reason: int = 0
    reason: str = ""  # the first one
    wrong_reason: str = ""  # the first one that does not name the problem, if any


@dataclass
class PoisonResult:
    outcomes: list[PoisonOutcome]
    valid_sent: int
    valid_samples_sent: int
    stats: dict[str, Any]
    drain_seconds: float
    problems: list[str] = field(default_factory=list)

    @property
    def poison_sent(self) -> int:
        return sum(o.sent for o in self.outcomes)


def run_poison(
    buffer: BufferProcess, redis_url: str, repeats: int, namespace: str = "tba", timeout: float = 120.0
) -> PoisonResult:
    """XADD every poison entry ``repeats`` times, each followed by a valid group, then read what became of them.

    Must run on a buffer whose dead-letter stream is empty and that nothing else writes to meanwhile:
    the counters of ``/v1/stats`` are compared before and after."""
    keys = Keys(namespace)
    client = sync_client(redis_url)
    before = httpx.get(f"{buffer.url}/v1/stats", timeout=10).json()
    assert client.xlen(keys.dead_letters) == before["dead_letters"] == 0, "the dead-letter stream is not empty"
    kind_of: dict[bytes, int] = {}
    catalogue = poison_catalogue()
    outcomes = [PoisonOutcome(p.name, 0) for p in catalogue]
    valid_sent = 0
    t_first = time.monotonic()
    for _ in range(repeats):
        for i, poison in enumerate(poison_catalogue()):
            kind_of[client.xadd(keys.trajectories, poison.fields)] = i
            outcomes[i].sent += 1
            client.xadd(keys.trajectories, {STREAM_FIELD: pack(_valid(valid_sent))})
            valid_sent += 1
    expected_groups = before["groups_ingested"] + len(kind_of) + valid_sent
    deadline = time.monotonic() + timeout
    stats = before
    while time.monotonic() < deadline:
        stats = httpx.get(f"{buffer.url}/v1/stats", timeout=10).json()
        if stats["groups_ingested"] >= expected_groups:
            break
        time.sleep(0.1)
    drain = time.monotonic() - t_first  # the buffer ingests while the entries are being added
    result = PoisonResult(
        outcomes=outcomes, valid_sent=valid_sent, valid_samples_sent=2 * valid_sent, stats=stats, drain_seconds=drain
    )
    if stats["groups_ingested"] < expected_groups:
        result.problems.append(
            f"ingest stalled: {stats['groups_ingested'] - before['groups_ingested']} of "
            f"{expected_groups - before['groups_ingested']} entries handled in {timeout:.0f} s"
        )
    for _, letter in client.xrange(keys.dead_letters):
        entry = letter[b"entry"]
        i = kind_of.pop(entry, None)
        if i is None:
            result.problems.append(f"dead-lettered entry {entry!r} was not poison: {letter[b'reason'][:200]!r}")
            continue
        reason = letter[b"reason"].decode(errors="replace")
        outcome = outcomes[i]
        outcome.dead_lettered += 1
        outcome.reason = outcome.reason or reason
        if catalogue[i].reason in reason and not reason.rstrip().endswith(":"):  # names it, and says what
            outcome.with_reason += 1
        else:
            outcome.wrong_reason = outcome.wrong_reason or reason
    for poison, outcome in zip(catalogue, outcomes, strict=True):
        if outcome.wrong_reason:
            result.problems.append(
                f"{outcome.name}: {outcome.dead_lettered - outcome.with_reason} reasons do not "
                f"name {poison.reason!r} or stop after it, e.g. {outcome.wrong_reason[:200]!r}"
            )
    for entry, i in kind_of.items():
        result.problems.append(f"{outcomes[i].name}: entry {entry.decode()} was not dead-lettered")
    counted = stats["dead_letters"] - before["dead_letters"]
    if counted != result.poison_sent:
        result.problems.append(f"/v1/stats counts {counted} dead letters; {result.poison_sent} poison entries sent")
    stored = stats["groups_stored"] - before["groups_stored"]
    if stored != valid_sent or stats["samples"] - before["samples"] != result.valid_samples_sent:
        result.problems.append(
            f"{stored} of {valid_sent} valid groups stored "
            f"({stats['samples'] - before['samples']} of {result.valid_samples_sent} samples)"
        )
    if client.xpending(keys.trajectories, keys.ingest_group)["pending"]:
        result.problems.append("entries are still pending on the trajectory stream")
    if not stats["ingest"]["healthy"]:
        result.problems.append(f"the ingest is unhealthy: {stats['ingest']['last_error']}")
    client.close()
    return result


# --- the run ---


@dataclass
class FuzzResult:
    schemathesis: SchemathesisResult | None  # None: not run (--max-examples 0)
    poison: PoisonResult
    buffer_ready_after: bool
    buffer_stopped_cleanly: bool
    min_cases: int

    def problems(self) -> list[str]:
        """Every way the run missed its pass criteria (empty: it passed)."""
        out = self.schemathesis_problems() if self.schemathesis is not None else []
        out += self.poison.problems
        if not self.buffer_ready_after:
            out.append("the buffer was not alive and ready after the run")
        if not self.buffer_stopped_cleanly:
            out.append("the buffer did not shut down gracefully on SIGTERM after the run")
        return out

    def schemathesis_problems(self) -> list[str]:
        """How the schemathesis run missed its criteria: 5xx answers, failed checks, no answers, too few cases."""
        st = self.schemathesis
        assert st is not None
        out = [f"{st.server_errors} responses with a 5xx status"] if st.server_errors else []
        out += [
            f"{f.check} ({f.code} {f.title}) on {f.operation}, {f.count} cases; answer {f.answer!r}; "
            f"reproducer: {f.reproducer}"
            for f in st.failures
        ]
        out += [f"no answer: {e}" for e in st.errors]
        if st.cases < self.min_cases:
            out.append(f"only {st.cases} cases generated, fewer than {self.min_cases}")
        return out


def seed_buffer(buffer: BufferProcess, prompts: int = 64) -> None:
    """Groups over a few versions, so that schemathesis's sample requests can get 200s and not only 409s."""
    with httpx.Client(
        base_url=buffer.url, headers={**buffer.headers, "Content-Type": "application/msgpack"}, timeout=10
    ) as http:
        for i in range(prompts):
            group = group_dict(
                group_id=f"seed-{i}",
                prompt_id=f"seed-{i}",
                version=i % 4,
                completions=[[i + 1, k + 1] for k in range(4)],
                rewards=[0.0, 0.5, 1.0, 1.5],
            )
            http.post("/v1/groups", content=pack(group)).raise_for_status()


def fuzz(
    redis_url: str,
    workdir: Path,
    max_examples: int,
    min_cases: int,
    poison_repeats: int,
    seed: int | None = None,
    schemathesis_timeout: float = 3600.0,
) -> FuzzResult:
    """The whole suite against a fresh buffer on ``redis_url`` (an empty Redis of the caller's); schemathesis
    only if ``max_examples`` is above 0."""
    buffer = BufferProcess(
        redis_url,
        workdir / "buffer.log",
        token=secrets.token_hex(16),
        consumer_name="fuzz",
        max_payload_bytes=MAX_PAYLOAD_BYTES,
        ingest_block_ms=50,
        max_sample_wait_seconds=MAX_FUZZ_WAIT_SECONDS,
    ).start()
    try:
        # Poison first, on an empty dead-letter stream; schemathesis may add valid groups of its own after.
        poison = run_poison(buffer, redis_url, poison_repeats)
        st = None
        if max_examples > 0:
            seed_buffer(buffer)
            st = run_schemathesis(buffer, workdir, max_examples, seed, schemathesis_timeout)
        ready = buffer.alive() and buffer.ready()
    finally:
        stopped = buffer.stop()
    return FuzzResult(
        schemathesis=st, poison=poison, buffer_ready_after=ready, buffer_stopped_cleanly=stopped, min_cases=min_cases
    )


def render(result: FuzzResult) -> str:
    """The "fuzz" section of RELIABILITY.md."""
    st, po = result.schemathesis, result.poison
    problems = result.problems()
    all_stored = not any("valid groups stored" in p for p in po.problems)
    http = (
        f"{st.cases} schemathesis cases, {st.server_errors} × 5xx, {len(st.failures)} distinct check failures"
        if st
        else "schemathesis not run"
    )
    lines = [
        f"**{'PASS' if not problems else 'FAIL'}**: {http}; "
        f"{po.poison_sent} poison stream entries, "
        f"{sum(o.with_reason for o in po.outcomes)} dead-lettered with a reason naming the problem; "
        f"{po.valid_sent} valid groups sent between them, {'all' if all_stored else 'NOT all'} stored."
    ]
    lines += ["", "### HTTP API (schemathesis)", ""]
    lines += _schemathesis_lines(st) if st else ["Not run (`--max-examples 0`).", ""]
    lines += [
        "### Poison stream entries",
        "",
        f"XADDed straight to the trajectory stream, each kind {po.outcomes[0].sent if po.outcomes else 0} times, "
        f"a valid group after every entry; the buffer's `max_payload_bytes` is {MAX_PAYLOAD_BYTES}. "
        f"All {po.poison_sent + po.valid_sent} entries handled {po.drain_seconds:.1f} s after the first was "
        f"added; "
        f"`/v1/stats`: dead_letters {po.stats['dead_letters']}, samples_dead_lettered "
        f"{po.stats['samples_dead_lettered']}, groups_stored {po.stats['groups_stored']} "
        f"(valid groups sent: {po.valid_sent}).",
        "",
    ]
    lines.append(
        table(
            ["entry", "sent", "dead-lettered", "reason names it", "reason (first)"],
            [[o.name, o.sent, o.dead_lettered, o.with_reason, _cell(o.reason[:120])] for o in po.outcomes],
        )
    )
    failures = st.failures if st else []
    others = [p for p in problems if not any(p.startswith(f"{f.check} (") for f in failures)]
    if others:  # the check failures are in their table above
        lines += ["### Other problems", ""] + [f"- {p[:1000]}" for p in others]
    return "\n".join(lines) + "\n"


def _schemathesis_lines(st: SchemathesisResult) -> list[str]:
    """The schemathesis part of the section: the run, the responses by operation, the failures."""
    lines = [
        f"schemathesis {st.version}, seed {st.seed}, every phase, `--checks all`, up to {st.max_examples} "
        f"examples per operation and phase, bearer token, `Accept: application/json`, JSON request bodies, "
        f"groups of the run's objective (`harness_document`); "
        f"{st.cases} cases in {st.seconds:.0f} s against a real `tba buffer` on a real Redis "
        f"(AOF), seeded with 64 groups so that `/v1/sample` can answer 200.",
        "",
    ]
    rows = []
    other: Counter[int] = Counter()  # methods the document does not list (the unsupported_method check)
    for operation, codes in sorted(st.responses.items()):
        if operation not in st.documented:
            other.update(codes)
            continue
        rows.append([f"`{operation}`", *_row(codes)])
    if other:
        rows.append(["other methods", *_row(other)])
    lines.append(table(["operation", "responses", "by status", "5xx"], rows))
    if st.failures:
        lines += ["Check failures (each distinct failure once, with the first case that showed it):", ""]
        lines.append(
            table(
                ["operation", "check", "failure", "cases", "answer", "reproducer"],
                [
                    [f"`{f.operation}`", f.check, f"{f.code} {f.title}", f.count, _cell(f.answer), _cell(f.reproducer)]
                    for f in st.failures
                ],
            )
        )
    else:
        lines += ["No check failed.", ""]
    if st.errors:
        lines += ["Requests without an answer:", ""] + [f"- {e}" for e in st.errors[:20]] + [""]
    return lines


def _row(codes: Counter[int]) -> list[object]:
    """Responses, their spread over status codes, and the 5xx among them."""
    spread = ", ".join(f"{code}: {n}" for code, n in sorted(codes.items()))
    return [sum(codes.values()), spread, sum(n for code, n in codes.items() if code >= 500)]


def _cell(text: str) -> str:
    """Text as inline code in a table cell (a ``|`` would end the cell, a newline the row)."""
    return "`" + text.replace("|", "%7C").replace("\n", " ").replace("`", "'") + "`"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reliability.fuzz", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--max-examples", type=int, default=300, help="schemathesis examples per operation and phase (0: not run)"
    )
    parser.add_argument("--min-cases", type=int, default=2000, help="fewest schemathesis cases the run must reach")
    parser.add_argument("--poison-repeats", type=int, default=20, help="times each poison entry is sent")
    parser.add_argument("--seed", type=int, default=None, help="schemathesis seed (default: a random one, reported)")
    parser.add_argument("--workdir", type=Path, default=None, help="where logs and reports go (default: runs/fuzz-*)")
    parser.add_argument(
        "--redis-url", default=None, help="an empty Redis of the caller's (default: a redis-server of the run's own)"
    )
    parser.add_argument("--no-report", action="store_true", help="print the section instead of writing RELIABILITY.md")
    parser.add_argument("--result", type=Path, default=None, help="also write what the run found as JSON here")
    args = parser.parse_args(argv)
    workdir = args.workdir or Path("runs") / time.strftime("fuzz-%Y%m%d-%H%M%S")
    workdir.mkdir(parents=True, exist_ok=True)
    with suite_redis(workdir, args.redis_url) as redis_url:
        result = fuzz(redis_url, workdir, args.max_examples, args.min_cases, args.poison_repeats, args.seed)
    print(f"fuzz: reports in {workdir}")
    if args.result:
        write_result(args.result, result, result.problems())
    return finish(
        "fuzz", render(result), result.problems(), sys.argv[1:] if argv is None else argv, write=not args.no_report
    )


if __name__ == "__main__":
    sys.exit(main())
