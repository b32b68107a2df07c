"""What a process runs on: its Redis and Slack clients, the job queue, config reloads."""
