"""Stream schemas: checking data against one, and what casts lose (docs/design.md §2)."""
