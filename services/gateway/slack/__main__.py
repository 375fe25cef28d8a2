"""`python -m services.gateway.slack [--instance ID ...]`: the Slack gateway."""

import sys

from services.gateway.base import main
from services.gateway.slack.channel import SlackChannel

sys.exit(main("slack", SlackChannel))
