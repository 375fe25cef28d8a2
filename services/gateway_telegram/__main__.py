"""`python -m services.gateway_telegram`: the Telegram gateway (a placeholder until the Telegram issue lands)."""

import sys

from common.runtime import run_gateway_placeholder

sys.exit(run_gateway_placeholder("telegram"))
