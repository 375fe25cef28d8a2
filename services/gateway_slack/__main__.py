"""`python -m services.gateway_slack`: the Slack gateway (a placeholder until the Slack issue lands)."""

import sys

from common.runtime import run_gateway_placeholder

sys.exit(run_gateway_placeholder("slack"))
