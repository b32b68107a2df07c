"""`make run`: the bot, a worker and Redis on this machine, or the playground without Slack settings."""
