"""`python -m workers`: an RQ worker for the bot's queues (`workers.process.main`)."""

from workers.process.main import main

raise SystemExit(main())
