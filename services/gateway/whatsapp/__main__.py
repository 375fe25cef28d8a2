"""`python -m services.gateway.whatsapp [--instance ID ...]`: the WhatsApp gateway (Cloud API)."""

import sys

from common import lean

lean.quiet_imports()

from services.gateway.base import main  # noqa: E402 - after lean
from services.gateway.whatsapp.channel import WhatsAppChannel  # noqa: E402

sys.exit(main("whatsapp", WhatsAppChannel))
