"""The Bolt app: Slack events and button clicks in, Block Kit out; it never runs the model."""
