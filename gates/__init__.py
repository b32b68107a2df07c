"""Who may do what: decide a call (`deciders`), spend tokens (`budgets`). The bot and the workers both ask."""
