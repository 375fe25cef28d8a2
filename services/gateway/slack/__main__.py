"""`python -m services.gateway_slack [--instance ID ...]`: the Slack gateway."""

import sys

from common.gateway.base import main
from services.gateway_slack.channel import SlackChannel

sys.exit(main("slack", SlackChannel))
