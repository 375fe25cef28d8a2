"""`python -m services.gateway.telegram [--instance ID ...]`: the Telegram gateway."""

import sys

from services.gateway.base import main
from services.gateway.telegram.channel import TelegramChannel

sys.exit(main("telegram", TelegramChannel))
