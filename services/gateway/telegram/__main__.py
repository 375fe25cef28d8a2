"""`python -m services.gateway.telegram [--instance ID ...]`: the Telegram gateway."""

import sys

from common import lean

lean.quiet_imports()

from services.gateway.base import main  # noqa: E402 - after lean
from services.gateway.telegram.channel import TelegramChannel  # noqa: E402

sys.exit(main("telegram", TelegramChannel))
