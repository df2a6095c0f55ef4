"""One look at a running stack, printed as one JSON line (scripts/docker-smoke.sh).

Runs inside the trainer container (``docker compose exec -T trainer python3 -``),
which has the project, the checkpoints volume and the Compose network: the
checkpoint manifest and versions on disk, the newest announced version in Redis,
and the buffer's per-searcher versions from ``GET /v1/stats``.
"""

import json
import os
import urllib.request

from tba.checkpoints import CheckpointStore
from tba.keys import Keys

out: dict = {}
store = CheckpointStore(os.environ["TBA_CHECKPOINT_DIR"])
try:
    manifest = store.read_manifest()
    out["manifest_version"] = manifest.version if manifest else None
    out["versions_on_disk"] = store.versions()
except Exception as err:  # report, never crash: the caller polls again
    out["checkpoint_error"] = repr(err)

try:
    from tba.redis_client import sync_client

    client = sync_client(os.environ["TBA_REDIS_URL"], timeout=5)
    raw = client.get(Keys(os.environ.get("TBA_NAMESPACE", "tba")).latest_manifest)
    out["announced_version"] = json.loads(raw)["version"] if raw else None
except Exception as err:
    out["redis_error"] = repr(err)

try:
    req = urllib.request.Request(
        os.environ["TBA_BUFFER_URL"].rstrip("/") + "/v1/stats",
        headers={"Accept": "application/json", "Authorization": f"Bearer {os.environ.get('TBA_AUTH_TOKEN', '')}"},
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        stats = json.load(resp)
    out["searcher_versions"] = stats.get("searcher_versions")
    out["samples"] = stats.get("samples")
except Exception as err:
    out["stats_error"] = repr(err)

print(json.dumps(out, default=str))
