"""`jobpool up`: the local stack on one machine (a private Redis, a supervisor, workers, the dashboard).

stack.py starts and stops it; find.py picks its redis-server, executor and ports; state.py holds its locks
and state file; guard.py keeps its Redis up through the workers' drain; listen.py tells which process serves
a port; follow.py lets other shells find its Redis through the state file while the stack lives.
"""
