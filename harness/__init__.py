"""The agent harness: a step function over a serialisable run state, with valves and a policy.

It imports nothing of Slack, Redis or RQ; `bot/` and `workers/` drive it, and so does the
terminal front end (`python -m harness "TASK"`).
"""
