"""Statistics, metrics, roofline and quality: computed from raw samples, in one place; the
regression gate (gate/), the report's narrative (narrative/) and what to deploy (recommend/)."""
