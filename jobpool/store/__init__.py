"""Everything jobpool says to Redis: the connection and its URL, the key schema, the Lua scripts (loaded,
run, their codes mapped to errors) and the checks on the server's configuration.

Nothing outside this package makes a Redis client or names a script (docs/architecture.md, "Components").
"""
