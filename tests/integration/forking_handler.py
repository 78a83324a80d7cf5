"""A handler process that forks a helper and then stops answering, recording both pids.

Run as ``forking_handler.py PIDFILE``: it answers ``open`` and ``close``
until its first other request; then it starts a helper process (a
``sleep``), appends its own pid and the helper's to PIDFILE, and never
answers again.  Started through a launcher (``sh -c '...; :'``, where the
shell stays the parent), it is what ``npm start`` or ``dotnet run`` make of a
handler: the process the harness started is not the one that hangs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys


def main(pidfile: str) -> None:
    hung = False
    for line in sys.stdin:
        request = json.loads(line)
        if not hung and request["op"] not in ("open", "close"):
            hung = True
            helper = subprocess.Popen(["sleep", "600"])
            with open(pidfile, "a", encoding="utf-8") as pids:
                pids.write(f"{os.getpid()}\n{helper.pid}\n")
        if hung:
            continue
        result = {"protocol": 1, "concurrent": False, "name": "forking"}
        answer = result if request["op"] == "open" else None
        print(json.dumps({"id": request["id"], "result": answer}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
