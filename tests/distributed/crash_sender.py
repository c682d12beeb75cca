"""An API replica that sends messages in a loop, for the crash tests (test_crash.py): built
by the composition root (`fanout.bootstrap.bootstrap_distributed`) from the engine URLs
and FANOUT_ settings of its environment, as `fanout serve` would build it.

    python -m tests.distributed.crash_sender TENANT CONVERSATION COUNT INTERVAL TAG MENTIONED SENDER...

stdout, one line each, flushed: `READY`, then per message `SENDING {json}` before the
command and `ACK {json}` (the command's result) once it returned, `DONE` at the end. A
line `ACK` is an acknowledgement: the test kills this process with SIGKILL at some point
and every acknowledged message must be delivered."""

from __future__ import annotations

import json
import os
import sys
import time

from fanout.bootstrap import bootstrap_distributed
from fanout.config import load_settings


def say(kind: str, body: object = None) -> None:
    sys.stdout.write(kind + ("" if body is None else " " + json.dumps(body, default=str)) + "\n")
    sys.stdout.flush()


def main(argv: list[str]) -> int:
    tenant, cid, count, interval, tag, mentioned, *senders = argv
    rt = bootstrap_distributed(load_settings(os.environ)).start()
    say("READY")
    for i in range(int(count)):
        sender = senders[i % len(senders)]
        body = {
            "sender": sender,
            "text": f"{tag} message {i}",
            "client_msg_id": f"{tag}-{i}",
            "mentions": [mentioned] if i % 2 == 0 else [],
        }
        say("SENDING", {"i": i, **body})
        result = rt.app.send_message(tenant, cid, **body)  # type: ignore[arg-type]
        say("ACK", {"i": i, **result})
        time.sleep(float(interval))
    say("DONE")
    rt.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
