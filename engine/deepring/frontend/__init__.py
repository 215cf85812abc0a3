"""The HTTP frontend: OpenAI and Anthropic routes over the rings to the workers."""
