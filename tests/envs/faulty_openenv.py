"""An OpenEnv server that misbehaves on purpose, speaking the protocol of OpenEnv's WebSocket ``/ws`` by hand
(so it can send what no well-formed server would): ``python -m tests.envs.faulty_openenv PORT [die]``.

``reset(seed)`` always answers ``prompt <seed>``. The first ``step`` of an episode depends on the seed:
seed % 4 == 0 answers ``done`` with reward 1, 1 never answers, 2 sends a frame that is not JSON, 3 sends an
observation whose ``text`` is a number. With ``die``, the process exits at the first step of any episode.
"""

from __future__ import annotations

import json
import os
import sys
import threading

from websockets.sync.server import serve


def observation(text, reward=None, done=False) -> str:
    return json.dumps({"type": "observation", "data": {"observation": {"text": text}, "reward": reward, "done": done}})


def session(ws, die: bool) -> None:
    seed = 0
    for raw in ws:
        message = json.loads(raw)
        kind = message.get("type")
        if kind == "reset":
            seed = int((message.get("data") or {}).get("seed") or 0)
            ws.send(observation(f"prompt {seed}"))
        elif kind == "step":
            if die:
                os._exit(1)
            mode = seed % 4
            if mode == 0:
                ws.send(observation("", reward=1.0, done=True))
            elif mode == 1:
                threading.Event().wait()  # hangs: the client's timeout must end the episode
            elif mode == 2:
                ws.send("this is not json {")
            else:
                ws.send(observation(5))
        elif kind == "close":
            return


def main() -> None:
    port, die = int(sys.argv[1]), "die" in sys.argv[2:]
    with serve(lambda ws: session(ws, die), "127.0.0.1", port) as server:
        print("ready", flush=True)
        server.serve_forever()


if __name__ == "__main__":
    main()
