"""Stream schemas: their Delta Lake form, checking data against one, and what casts lose
(docs/design.md §2)."""
