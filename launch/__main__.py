"""`python -m launch` (what `make run` runs): see `launch.local`."""

from launch.local import main

raise SystemExit(main())
