"""A stand-in for peer_compare.peer_item in child processes (importable by spawned children)."""

import os
import time


def fake_item(cls, backend, variant, optimize=None):
    if cls == "Crash":
        os._exit(3)
    if cls == "Hang":
        time.sleep(120)
    return {"class": cls, "backend": backend, "variant": variant, "peer": "pass", "pid": os.getpid()}
