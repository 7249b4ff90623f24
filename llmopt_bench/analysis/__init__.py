"""Statistics, metrics, roofline and quality: computed from raw samples, in one place."""
