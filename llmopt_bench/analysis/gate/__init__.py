"""The regression gate: two runs compared figure by figure, with the noise, the host's part and the
completeness that decide `llmopt compare`'s exit."""
