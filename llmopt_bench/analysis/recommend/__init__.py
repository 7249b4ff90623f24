"""What to deploy: the choice among a run's deployable configurations, and it in words."""
