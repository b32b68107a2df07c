"""`python -m harness "TASK"`."""

from harness.cli import main

raise SystemExit(main())
