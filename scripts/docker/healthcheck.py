"""Container HEALTHCHECK: GET /readyz of this container's own HTTP server.

Standard library only, so every image (even the light buffer image) can run it.
The port comes from the service's own setting: TBA_PORT for the buffer,
TBA_METRICS_PORT for the trainer and searchers (the environment server, TBA_PORT, is
checked on /health). Exit 0 when ready, 1 otherwise,
with the server's reason on stdout (``docker inspect`` shows it).
"""

import os
import sys
import urllib.error
import urllib.request

path = sys.argv[1] if len(sys.argv) > 1 else "/readyz"
port = os.environ.get("TBA_METRICS_PORT") or os.environ.get("TBA_PORT") or "8400"
try:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
        print(resp.read(200).decode(errors="replace").strip())
    sys.exit(0)
except urllib.error.HTTPError as err:
    print(f"{err.code}: {err.read(200).decode(errors='replace').strip()}")
except OSError as err:
    print(f"unreachable on port {port}: {err}")
sys.exit(1)
