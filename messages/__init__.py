"""Everything Slack is shown, as Block Kit: pure functions of the run's data, no I/O.

The bot and the workers both import it; it imports only `harness` (for the run's state and some
of its sentences) and what it builds with (slack_sdk's block models, markdown-it-py). One module per
kind of thing built:

- `text`: untrusted text made inert and visible (escape, cut, code), mentions, dates, counts;
- `limits`: what Slack accepts in a message, a block and a modal;
- `blocks`: a `Message`, its sections and contexts, fitting them to the limits, `notice`;
- `markdown`: the model's Markdown as Slack mrkdwn;
- `arguments`: a call's arguments laid out for a reviewer;
- `cards`: approval cards, limit questions, grants and the escalation reminder;
- `turns`: the Working message and the turn summaries;
- `tasks`: a call as a task of a streamed message, its line following the call to the end;
- `reasons`: why a call has its tier, in plain words (the config's own words stay in the CLI);
- `endings`: the final answer and its feedback buttons, stops and failures;
- `modals`: View all arguments, Edit, Decline with a reason;
- `home`: the Home tab;
- `texts`: every sentence the bot and its workers say in Slack.
"""
