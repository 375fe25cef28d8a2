"""`python -m services.gateway_whatsapp [--instance ID ...]`: the WhatsApp gateway (Cloud API)."""

import sys

from common.gateway.base import main
from services.gateway_whatsapp.channel import WhatsAppChannel

sys.exit(main("whatsapp", WhatsAppChannel))
