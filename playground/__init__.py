"""The playground: a local stand-in for Slack and an offline demo model, to try the bot with neither."""
