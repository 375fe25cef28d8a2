"""`python -m services.gateway_telegram [--instance ID ...]`: the Telegram gateway."""

import sys

from common.gateway.base import main
from services.gateway_telegram.channel import TelegramChannel

sys.exit(main("telegram", TelegramChannel))
