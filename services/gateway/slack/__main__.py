"""`python -m services.gateway.slack [--instance ID ...]`: the Slack gateway."""

import sys

from common import lean

lean.quiet_imports()

from services.gateway.base import main  # noqa: E402 - after lean
from services.gateway.slack.channel import SlackChannel  # noqa: E402

sys.exit(main("slack", SlackChannel))
