"""Everything jobpool says to a pool's Redis: the connection and its URL (redisurl.py, redisopts.py), the key
schema (keys.py), the Lua scripts loaded and run with their codes mapped to errors (luatext.py, runner.py),
one typed method per script with its reply as a small value (calls.py `Store`, replies.py), the reads and
records outside the scripts by who makes them (reads.py, eventreads.py, fleetreads.py, statusreads.py,
sweepio.py, workerio.py), and the check of the server's eviction policy (redispolicy.py).

No module outside this package names a script, passes KEYS or ARGV, or reads a reply by position.
"""
