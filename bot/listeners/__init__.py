"""The Bolt app's listeners, one module per surface, each with `register(app, deps, then)`.

- `mentions`: mentions and direct messages start runs;
- `approvals`: approve, decline, approve for the thread, revoke a grant;
- `modals`: the arguments, decline-with-reason and edit modals;
- `runs`: Stop, Continue at a limit, Retry, feedback;
- `home`: the Home tab;
- `assistant`: the assistant pane's suggested prompts and Slack's own stop.
"""
