"""Everything jobpool says to a pool's Redis: the connection and its URL (redisurl.py, redisopts.py), the key
schema (keys.py), the Lua scripts loaded and run with their codes mapped to errors (luatext.py, runner.py),
one typed method per script with its reply as a small value (calls.py `Store`, replies.py), the reads and
records outside the scripts by who makes them (reads.py, eventreads.py, fleetreads.py, statusreads.py,
sweepio.py, workerio.py), the check of the server's eviction policy (redispolicy.py), RQ's connection
(rqconnection.py) and the Redis of a `jobpool up` stack (upstack.py).

No module outside this package names a script, passes KEYS or ARGV, reads a reply by position, sends a
command or makes a client; RQ's own calls on the connection it is given are the one exception
(docs/architecture.md, "Only the store talks to Redis").
"""
