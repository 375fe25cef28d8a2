"""`python -m common.supervisord_run -c FILE`: supervisord, started without OpenSSL (see common/lean.py).

supervisord speaks XML-RPC on a unix socket only; http.client and hashlib load OpenSSL if they can, ~4.5 MB
of RSS for a process that never opens a TLS connection. The module's name keeps "supervisord" in the command
line, which `starling status` and the pid registry look for.

supervisor.compat takes one thing from importlib.metadata, EntryPoint, to load the "module:attr" specs of
the config (our one rpcinterface factory). importlib.metadata brings csv, zipfile and threading with it:
~1 MB of RSS in supervisord. supervisor is imported here with a stand-in that loads those specs; the real
module is importable again afterwards.
"""

import importlib
import sys
import types

from common import lean

lean.without_openssl()


class EntryPoint:
    """importlib.metadata.EntryPoint's load() for a "module:attr.attr" value, as supervisor.compat calls it:
    ``EntryPoint(None, spec, None).load()``."""

    def __init__(self, name, value, group) -> None:
        self.name, self.value, self.group = name, value, group

    def load(self):
        module, _, attrs = self.value.partition(":")
        found = importlib.import_module(module.strip())
        for attr in filter(None, attrs.strip().split(".")):
            found = getattr(found, attr)
        return found


def _import_supervisord():
    stand_in = types.ModuleType("importlib.metadata")
    stand_in.EntryPoint = EntryPoint
    placed = sys.modules.setdefault("importlib.metadata", stand_in) is stand_in
    try:
        from supervisor import supervisord
    finally:
        if placed and sys.modules.get("importlib.metadata") is stand_in:
            del sys.modules["importlib.metadata"]
    return supervisord


supervisord = _import_supervisord()

if __name__ == "__main__":
    sys.exit(supervisord.main())
