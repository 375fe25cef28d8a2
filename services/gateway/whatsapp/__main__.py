"""`python -m services.gateway.whatsapp [--instance ID ...]`: the WhatsApp gateway (Cloud API)."""

import sys

from services.gateway.base import main
from services.gateway.whatsapp.channel import WhatsAppChannel

sys.exit(main("whatsapp", WhatsAppChannel))
