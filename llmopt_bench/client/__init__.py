"""The measuring client of any OpenAI-compatible endpoint, and the server's own clock beside it."""
