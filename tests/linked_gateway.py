"""`python -m tests.linked_gateway --home H`: the WhatsApp gateway as production runs it, with the fake
linked-device client of tests/fake_linked.py passed in where neonize would be (tests only; production
code loads no client by name)."""

import sys

from services.gateway.base import main
from services.gateway.whatsapp.channel import WhatsAppChannel
from tests.fake_linked import FakeClient


class FakeLinkedChannel(WhatsAppChannel):
    def __init__(self, gateway, cfg) -> None:
        super().__init__(gateway, cfg, make_client=FakeClient)


if __name__ == "__main__":
    sys.exit(main("whatsapp", FakeLinkedChannel))
