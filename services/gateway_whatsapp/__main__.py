"""`python -m services.gateway_whatsapp`: the WhatsApp gateway (a placeholder until the WhatsApp issue lands)."""

import sys

from common.runtime import run_gateway_placeholder

sys.exit(run_gateway_placeholder("whatsapp"))
