"""LLM access for every service: role-based model configs, one client factory on the
`anthropic` SDK, prompts as named constants, and cost from usage × price."""
