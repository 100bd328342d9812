"""MCP servers of our own for the bridge's edge cases (crashes, hangs, slow starts, changing
inventories, malformed content), plus the npm-installed third-party servers under node/."""
